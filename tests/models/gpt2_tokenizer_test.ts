/**
 * GPT-2's tokenizer (models/gpt2_tokenizer.ts, js-tiktoken's GPT-2 ranks)
 * against GPT-2 ids published by others, never our own output:
 * - OpenAI tiktoken's tests (tests/test_encoding.py, encoding "gpt2");
 * - gpt-tokenizer's tests (src/GptEncoding.test.ts, whose "gpt2" results are
 *   r50k_base's) and its test plans (data/TestPlans.txt, r50k_base, which is
 *   GPT-2's encoding), made with tiktoken;
 * and, for runs of whitespace, which neither publishes, gpt-tokenizer's own
 * r50k_base encoder (another implementation, with its own copy of the ranks).
 * Plus decode(encode(s)) = s over random strings of every script.
 */
import assert from "node:assert/strict";
import { encode as otherEncoder } from "npm:gpt-tokenizer@3.4.0/encoding/r50k_base";
import { decodeGpt2, encodeGpt2 } from "../../models/mod.ts";
import { RandomGenerator } from "../../mod.ts";

/** [text, GPT-2 ids] as published. */
const PUBLISHED: [string, number[]][] = [
  // tiktoken's tests/test_encoding.py (ASCII, digits, the separator).
  ["hello world", [31373, 995]],
  ["hello <|endoftext|>", [31373, 220, 50256]],
  ["0000", [2388]],
  ["00000000000000000", [8269, 10535, 830]],
  // gpt-tokenizer's src/GptEncoding.test.ts (single whitespace, a split word, emoji).
  [" ", [220]],
  ["\t", [197]],
  ["indivisible", [521, 452, 12843]],
  ["hello 👋 world 🌍", [31373, 50169, 233, 995, 12520, 234, 235]],
  // gpt-tokenizer's data/TestPlans.txt, r50k_base (accents, CJK, Cyrillic, flags).
  ["Hola, mundo! ¿Cómo estás hoy? 🇪🇸", [
    39,
    5708,
    11,
    27943,
    78,
    0,
    1587,
    123,
    34,
    10205,
    5908,
    1556,
    40138,
    289,
    726,
    30,
    12520,
    229,
    103,
    8582,
    229,
    116,
  ]],
  ["こんにちは、世界！お元気ですか？", [
    46036,
    22174,
    28618,
    2515,
    94,
    31676,
    23513,
    10310,
    244,
    45911,
    234,
    171,
    120,
    223,
    2515,
    232,
    17739,
    225,
    36365,
    245,
    30640,
    33623,
    27370,
    171,
    120,
    253,
  ]],
  ["你今天遇到什么有趣的事情了吗？🇨🇳", [
    19526,
    254,
    20015,
    232,
    25465,
    34402,
    229,
    26344,
    108,
    20015,
    222,
    20046,
    230,
    17312,
    231,
    164,
    114,
    96,
    21410,
    12859,
    233,
    46349,
    227,
    12859,
    228,
    28938,
    245,
    171,
    120,
    253,
    8582,
    229,
    101,
    8582,
    229,
    111,
  ]],
  ["Привет, мир! Как дела?", [
    140,
    253,
    21169,
    18849,
    38857,
    16843,
    20375,
    11,
    12466,
    120,
    18849,
    21169,
    0,
    12466,
    248,
    16142,
    31583,
    12466,
    112,
    16843,
    30143,
    16142,
    30,
  ]],
  ["Chào mừng bạn đến với thế giới của lập trình. 🇻🇳", [
    1925,
    24247,
    78,
    285,
    157,
    119,
    104,
    782,
    275,
    157,
    118,
    94,
    77,
    34754,
    239,
    157,
    118,
    123,
    77,
    410,
    157,
    119,
    249,
    72,
    294,
    157,
    118,
    123,
    308,
    72,
    157,
    119,
    249,
    72,
    269,
    157,
    119,
    100,
    64,
    300,
    157,
    118,
    255,
    79,
    491,
    127,
    105,
    77,
    71,
    13,
    12520,
    229,
    119,
    8582,
    229,
    111,
  ]],
];

Deno.test("GPT-2 tokenizer: ids of ASCII, digits, accents, CJK, Cyrillic and emoji equal the published GPT-2 ids", () => {
  for (const [text, ids] of PUBLISHED) {
    assert.deepEqual(encodeGpt2(text), ids, JSON.stringify(text));
    assert.equal(decodeGpt2(ids), text, `decode ${JSON.stringify(text)}`);
  }
});

Deno.test("GPT-2 tokenizer: runs of spaces, tabs and newlines encode as gpt-tokenizer's r50k_base does", () => {
  const texts = [
    "a  b",
    "a   b    c",
    "   ",
    "\n\n\n",
    "x    \n\n\t  y",
    "def f():\n        return  1\n\n\n",
    "end.   \n",
    "\t\t\tindented\r\n\r\n",
  ];
  for (const text of texts) {
    assert.deepEqual(encodeGpt2(text), otherEncoder(text), JSON.stringify(text));
  }
  // tiktoken splits a run before a word as GPT-2's regex does: the last space joins the word.
  assert.deepEqual(encodeGpt2("a  b"), [64, 220, 275]);
});

Deno.test("GPT-2 tokenizer: decode(encode(s)) = s for random strings of every script, and bad ids are refused", () => {
  const ranges = [
    [0x20, 0x7e],
    [0x09, 0x0d],
    [0xa0, 0x24f],
    [0x370, 0x4ff],
    [0x3040, 0x30ff],
    [
      0x4e00,
      0x9fff,
    ],
    [0xac00, 0xd7a3],
    [0x1f300, 0x1faff],
    [0x10000, 0x10fff],
  ];
  const rng = new RandomGenerator(5);
  for (let n = 0; n < 200; n++) {
    const u = rng.uniform(40);
    let text = "";
    for (let i = 0; i < 40; i += 2) {
      const [lo, hi] = ranges[Math.floor(u[i] * ranges.length)];
      text += String.fromCodePoint(lo + Math.floor(u[i + 1] * (hi - lo + 1)));
    }
    assert.equal(decodeGpt2(encodeGpt2(text)), text, JSON.stringify(text));
  }
  assert.throws(() => decodeGpt2([1, 50257]), /id 50257 at 1 is not a GPT-2 id/);
});
