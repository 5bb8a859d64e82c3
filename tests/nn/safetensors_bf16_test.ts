/**
 * bf16 in safetensors files: a bf16 tensor saves as BF16 and loads back as
 * bf16 with its bits; a BF16 entry loads into f32 parameters widened exactly
 * (PyTorch's bf16 checkpoints into fp32 models) and into bf16 parameters
 * unchanged; PyTorch reads our BF16 files as torch.bfloat16 with the same
 * bits, and we read its.
 */
import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import { Linear } from "../../nn/mod.ts";
import { decodeSafetensors, entryToTensor, tensorToEntry } from "../../nn/safetensors.ts";
import {
  loadModule,
  loadSafetensors,
  saveModule,
  saveSafetensors,
} from "../../nn/safetensors_file.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";
import { runTorch } from "../helpers/torch.ts";

/** bf16 bits as little-endian bytes. */
const bytesOfBits = (bits: readonly number[]) => new Uint8Array(Uint16Array.from(bits).buffer);
/** The exact f32 value of bf16 bits. */
const valueOf = (bits: number) => new Float32Array(new Uint32Array([bits << 16]).buffer)[0];

/** The bf16 bits a tensor holds (raw bytes, NaN payloads included). */
async function bitsOf(t: Tensor): Promise<number[]> {
  const { data } = await tensorToEntry(t);
  return [...new Uint16Array(data.slice().buffer)];
}

/**
 * Awkward finite bf16 values for a [3, 5] weight: the largest finite (which read as f16 bits would
 * be NaN), the smallest subnormal, −0, ordinary values.
 */
const WEIGHT_BITS = [
  0x7f7f,
  0xff7f,
  0x7e96,
  0x0001,
  0x8000,
  0x3f80,
  0xbfc0,
  0x4049,
  0x3eaa,
  0x0080,
  0x7c00,
  0x7d00,
  0x7f00,
  0xc2f7,
  0x3c23,
];
const BIAS_BITS = [0x3f80, 0x8001, 0x4b00];

Deno.test({
  name: "saveModule of a bf16 model writes BF16 entries; loadModule gives bf16 parameters the " +
    "same bits, f32 parameters the exact values and f16 ones each rounded once",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const model = new Linear(5, 3, { seed: 1, dtype: "bf16" });
    const same = new Linear(5, 3, { seed: 2, dtype: "bf16" });
    const wide = new Linear(5, 3, { seed: 3 });
    try {
      model.weight.writeBytes(bytesOfBits(WEIGHT_BITS));
      model.bias!.writeBytes(bytesOfBits(BIAS_BITS));
      // Finite everywhere: large values whose bits would be f16 NaNs must not be refused.
      await saveModule(`${dir}/m.safetensors`, model);
      const { entries } = await loadSafetensors(`${dir}/m.safetensors`);
      assert.equal(entries.get("weight")!.dtype, "bf16");
      assert.deepEqual([...entries.get("weight")!.data], [...bytesOfBits(WEIGHT_BITS)]);
      await loadModule(`${dir}/m.safetensors`, same);
      assert.deepEqual(await bitsOf(same.weight), WEIGHT_BITS);
      assert.deepEqual(await bitsOf(same.bias!), BIAS_BITS);
      await loadModule(`${dir}/m.safetensors`, wide);
      assert.equal(wide.weight.dtype, "f32");
      assert.deepEqual([...await wide.weight.read()], WEIGHT_BITS.map(valueOf));
      assert.deepEqual([...await wide.bias!.read()], BIAS_BITS.map(valueOf));
      if (gpu.f16) {
        // Into f16 parameters: rounded once from the exact value (past 65504: ±Inf, refused).
        const half = new Linear(5, 3, { seed: 4, dtype: "f16" });
        try {
          // The large finite values do not fit f16: refused as such, not as "non-finite".
          const before = await bitsOf(half.weight);
          await assert.rejects(
            () => loadModule(`${dir}/m.safetensors`, half),
            (e: Error) =>
              /weight holds \d+ finite value\(s\) beyond f16's range \(largest finite 65504\)/
                .test(e.message) && !/non-finite/.test(e.message),
          );
          assert.deepEqual(await bitsOf(half.weight), before, "unchanged after a refused load");
          const small = WEIGHT_BITS.map((b) => (b & 0x7f80) > 0x4700 ? b & 0x807f : b);
          model.weight.writeBytes(bytesOfBits(small));
          model.bias!.writeBytes(bytesOfBits([0x3f80, 0x8001, 0x4300]));
          await saveModule(`${dir}/small.safetensors`, model);
          await loadModule(`${dir}/small.safetensors`, half);
          const want = Float16Array.from(small.map(valueOf));
          assert.deepEqual([...await half.weight.read()], [...want]);
          assert.deepEqual([...await half.bias!.read()], [1, -0, 128]);
        } finally {
          half.dispose();
        }
      }
      // A NaN in a bf16 weight is refused by name, and the module is left as it was.
      model.weight.writeBytes(bytesOfBits([0x7fc1, ...WEIGHT_BITS.slice(1)]));
      await assert.rejects(
        () => saveModule(`${dir}/bad.safetensors`, model),
        /tensor "weight" holds 1 non-finite value/,
      );
      await saveModule(`${dir}/nan.safetensors`, model, { allowNonFinite: true });
      await assert.rejects(
        () => loadModule(`${dir}/nan.safetensors`, same),
        /weight holds 1 non-finite/,
      );
      assert.deepEqual(await bitsOf(same.weight), WEIGHT_BITS, "unchanged after a refused load");
    } finally {
      for (const m of [model, same, wide]) m.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "PyTorch's BF16 fixture (safetensors.torch.save_file) loads as bf16 with its bits",
  ...GPU_TEST,
  async fn() {
    const file = await Deno.readFile(
      new URL("../fixtures/torch/state_bf16.safetensors", import.meta.url),
    );
    const { entries } = decodeSafetensors(file);
    const weight = entries.get("1.weight")!;
    assert.equal(weight.dtype, "bf16");
    const t = entryToTensor(weight);
    try {
      assert.deepEqual([...(await tensorToEntry(t)).data], [...weight.data], "through the GPU");
      // read() gives the bits shifted up: the exact values PyTorch holds.
      const bits = new Uint16Array(weight.data.slice().buffer);
      assert.deepEqual([...await t.read()], [...bits].map(valueOf));
    } finally {
      t.dispose();
    }
  },
});

/**
 * Python: reads the safetensors file argv[1] (the published layout, parsed here: the
 * `safetensors` package is not needed) into torch tensors, prints each BF16 tensor's name and
 * int16 bits, and writes argv[2]: one BF16 tensor "t" of torch's own bfloat16 rounding of the
 * values on stdin.
 */
const TORCH_SCRIPT = `
import json, struct, sys, torch
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
for name, info in sorted(header.items()):
    if name == "__metadata__" or info["dtype"] != "BF16":
        continue
    begin, end = info["data_offsets"]
    t = torch.frombuffer(bytearray(raw[8 + n + begin:8 + n + end]), dtype=torch.bfloat16)
    t = t.reshape(info["shape"])
    assert t.dtype == torch.bfloat16
    print(name, " ".join(str(v & 0xffff) for v in t.flatten().view(torch.int16).tolist()))
values = torch.tensor([float(s) for s in sys.stdin.read().split()], dtype=torch.float32)
data = values.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
head = json.dumps({"t": {"dtype": "BF16", "shape": [len(values)], "data_offsets": [0, len(data)]}})
head += " " * (-len(head) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(head)) + head.encode() + data)
`;

Deno.test({
  name: "PyTorch reads our BF16 file as torch.bfloat16 with the same bits, and we read its",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const w = Tensor.empty([3, 5], "bf16");
    w.writeBytes(bytesOfBits(WEIGHT_BITS));
    const odd = Tensor.from([1.5, -0.1, 3e38], [3], { dtype: "bf16" });
    try {
      await saveSafetensors(`${dir}/ours.safetensors`, { w, odd });
      const values = [0.1, -1 / 3, 1e-40, 65504.5, 3.3e38, 1 + 2 ** -8];
      const out = await runTorch(TORCH_SCRIPT, {
        args: [`${dir}/ours.safetensors`, `${dir}/torch.safetensors`],
        stdin: values.join(" "),
      });
      const printed = new Map(
        out.trim().split("\n").map((line) => {
          const [name, ...bits] = line.split(" ");
          return [name, bits.map(Number)];
        }),
      );
      assert.deepEqual(printed.get("w"), WEIGHT_BITS);
      assert.deepEqual(printed.get("odd"), await bitsOf(odd));
      const { entries } = await loadSafetensors(`${dir}/torch.safetensors`);
      const theirs = entryToTensor(entries.get("t")!);
      const ours = Tensor.from(values, [values.length], { dtype: "bf16" });
      try {
        assert.equal(theirs.dtype, "bf16");
        assert.deepEqual(await bitsOf(theirs), await bitsOf(ours), "torch's rounding is ours");
      } finally {
        theirs.dispose();
        ours.dispose();
      }
    } finally {
      w.dispose();
      odd.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
