/**
 * The examples as a user runs them, in subprocesses: a bad flag or an output
 * path that cannot be written is one line and exit status 2 before anything
 * trains; a finished run resumes to an honest report; a resumed run counts
 * only its own steps and keeps the whole chart; a save that fails mid-run is
 * one line, then the run stops or goes on as the user chose.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  afterFirstSave,
  assertRefused,
  events,
  GPT2,
  MNIST,
  QUICK,
  run,
  TINY_GPT,
  withTempDir,
} from "../helpers/examples.ts";
import { parseMnistArgs } from "../../examples/mnist/args.ts";
import { ROOT } from "../helpers/bundle.ts";
import { parseTinyGptArgs, UsageError } from "../../examples/tiny_gpt/args.ts";

Deno.test("examples: every bad flag is one line and exit status 2, before any training", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const cases: [string[], RegExp][] = [
      [
        ["--batch", "99999999"],
        /^mnist: --batch must be an integer from 1 to 60000, not "99999999"/,
      ],
      [["--batch", "0x10"], /--batch must be an integer from 1 to 60000, not "0x10"/],
      [["--batch", "-3"], /--batch must be an integer from 1 to 60000, not "-3"/],
      [["--epochs", "1e9"], /--epochs must be an integer from 1 to 1000, not "1e9"/],
      [["--loss-scale", "8"], /--loss-scale needs --amp/],
      [["--amp", "--loss-scale", "1000"], /--loss-scale must be 0 \(dynamic\) or a power of two/],
      [["--amp=bfloat16"], /^mnist: --amp takes f16 \(the default\) or bf16, not "bfloat16"/],
      [["--amp", "fp8"], /^mnist: --amp takes f16 \(the default\) or bf16, not "fp8"/],
      [
        ["--amp", "bf16", "--loss-scale", "8"],
        /--loss-scale is for --amp f16: bf16 has f32's range/,
      ],
      [["--momentum", "0.5"], /--momentum is for --optimizer sgd/],
      [["--model", "resnet"], /--model must be mlp or cnn, not "resnet"/],
      [["--model", "cnn", "--shift", "9"], /--shift must be an integer from 0 to 8, not "9"/],
      [["--optimizer", "rmsprop"], /--optimizer must be sgd or adam, not "rmsprop"/],
      [["--backend", "metal"], /^mnist: --backend must be builtin, dawn or dawn-null, not "metal"/],
      [["--no-such-flag"], /^mnist: .*no-such-flag.* \(see --help\)$/],
      [["--epoch", "3"], /^mnist: unknown flag --epoch; did you mean --epochs\? \(see --help\)$/],
      [["--bach=64"], /^mnist: unknown flag --bach; did you mean --batch\?/],
      [["--override"], /^mnist: --override is for --resume/],
      [
        ["--accum", "5", "--limit", "256", "--epochs", "1"],
        /--accum 5 needs at least 5 batches, but 1 epoch\(s\) of 256 images in batches of 128 give 2/,
      ],
      [["--save", join(dir, "missing", "run.safetensors")], /folder ".*missing" does not exist/],
      [["--plot", dir], /--plot .*: it is a folder; give a file name/],
    ];
    for (const [args, message] of cases) {
      assertRefused(await run(MNIST, [...args, "--json"]), message, args.join(" "));
    }
    const noWrite = await run(MNIST, ["--save", join(dir, "run.safetensors"), "--json"], false);
    assertRefused(noWrite, /no permission to write it; run with --allow-write/, "no --allow-write");
    const gpt = await run(TINY_GPT, ["--plot", join(dir, "loss.svg"), "--json"], false);
    assertRefused(gpt, /^tiny_gpt: --plot .*run with --allow-write/, "tiny_gpt --plot");
    assertRefused(await run(TINY_GPT, ["--steps", "-3"]), /--steps must be an integer >= 1/, "-3");
    assertRefused(
      await run(TINY_GPT, ["--step", "3"]),
      /^tiny_gpt: unknown flag --step; did you mean --steps\?/,
      "--step",
    );
    assertRefused(
      await run(GPT2, ["--random", "124M", "--data", "x.txt", "--step", "3"]),
      /^gpt2: unknown flag --step; did you mean --steps\? \(see --help\)$/,
      "gpt2 --step",
    );
    assertRefused(
      await run(TINY_GPT, ["--backend", "wgpu"]),
      /--backend must be builtin, dawn or dawn-null/,
      "wgpu",
    );
    assertRefused(
      await run(GPT2, ["--random", "124M", "--prompt", "hi", "--backend", "wgpu"]),
      /^gpt2: --backend must be builtin, dawn or dawn-null/,
      "gpt2 --backend",
    );
    const bench = join(ROOT, "examples/bench.ts");
    assertRefused(
      await run(bench, ["mlp", "--backend", "d"]),
      /^bench: --backend must be/,
      "bench",
    );
    const help = await run(MNIST, ["--help"]);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /with Adam \(default\) or SGD/);
    assert.match(help.stdout, /the last\s+line is \{"event":"final"/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("examples: --limit below the default batch trains on one batch of them; the memory line names only measured steps", async () => {
  // It used to refuse: "--batch must be at most 100", a flag the user never gave.
  const r = await run(MNIST, ["--limit", "100", "--epochs", "1"], false);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /batch 100, 1 epoch\(s\) × 1 steps/);
  assert.doesNotMatch(r.stdout, /n\/a/, "no 'n/a B' for steps the run never reached");
  assert.match(r.stdout, /^allocated between steps: after step 1 \d+ B$/m);
});

Deno.test("examples: --backend names the WebGPU backend; without it initGpu's default holds", () => {
  for (const parse of [parseMnistArgs, parseTinyGptArgs]) {
    assert.equal(parse(["--backend", "dawn"])!.backend, "dawn");
    assert.equal(parse(["--backend=builtin"])!.backend, "builtin");
    assert.equal(parse([])!.backend, undefined, "HALFSTEP_BACKEND, else builtin");
  }
});

Deno.test("examples: --amp bf16 picks bf16; --amp alone, --amp f16 and --fp16 stay f16", () => {
  for (const parse of [parseMnistArgs, parseTinyGptArgs]) {
    const dtypeOf = (args: string[]) => {
      const cfg = parse(args)!;
      return cfg.amp ? cfg.ampDtype : "f32";
    };
    assert.equal(dtypeOf(["--amp", "bf16", "--seed", "2"]), "bf16");
    assert.equal(dtypeOf(["--amp=bf16"]), "bf16");
    assert.equal(dtypeOf(["--amp", "--seed", "2"]), "f16");
    assert.equal(dtypeOf(["--seed", "2", "--amp"]), "f16");
    assert.equal(dtypeOf(["--amp", "f16"]), "f16");
    assert.equal(dtypeOf(["--fp16"]), "f16");
    assert.equal(dtypeOf([]), "f32");
    assert.equal(
      parse(["--amp", "bf16", "--seed", "2"])!.seed,
      2,
      "the flags after it still parse",
    );
  }
});

Deno.test("examples: mnist and tiny_gpt --amp bf16 train in bf16 without loss scaling", async () => {
  const r = await run(MNIST, [...QUICK, "--amp", "bf16", "--json"]);
  assert.equal(r.code, 0, r.stderr);
  const start = events(r.stdout).find((e) => e.event === "start")!,
    final = events(r.stdout).at(-1)!;
  assert.equal(start.ampDtype, "bf16");
  assert.equal(final.event, "final");
  assert.equal(final.lossScale, 1, "no loss scaling");
  assert.ok((final.testAccuracy as number) > 0.6, `bf16 learns: ${final.testAccuracy}`);
  const quick = ["--steps", "3", "--log-every", "3", "--eval-windows", "4", "--samples", "1"];
  const gpt = await run(TINY_GPT, [...quick, "--amp", "bf16", "--json"]);
  assert.equal(gpt.code, 0, gpt.stderr);
  assert.equal(events(gpt.stdout).find((e) => e.event === "start")!.ampDtype, "bf16");
  assert.equal(events(gpt.stdout).at(-1)!.lossScale, 1);
});

/** The number of points of the loss line in an SVG chart written by --plot. */
async function chartPoints(path: string): Promise<number> {
  const svg = await Deno.readTextFile(path);
  const d = svg.match(/<path d="(M[^"]*)"/)![1];
  return (d.match(/[ML]/g) ?? []).length;
}

Deno.test("examples: a resumed run counts its own steps, keeps the chart, and a finished one reports honestly", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const state = join(dir, "run.safetensors"), chart = join(dir, "loss.svg");
    const flags = ["--limit", "1024", "--epochs", "2", "--save", state, "--plot", chart, "--json"];
    // Killed right after epoch 1 was saved: the state and the chart are on disk.
    const killed = await afterFirstSave(flags, () => "kill");
    assert.notEqual(killed.code, 0);
    assert.equal(await chartPoints(chart), 1, "the chart is written after every epoch");
    // Other flags cannot resume it.
    const mismatch = await run(MNIST, [...flags, "--seed", "1", "--resume", state]);
    assert.equal(mismatch.code, 2);
    assert.match(mismatch.stderr, /Resume with the saved flags/);
    // The killed run's lock file is taken over: the OS dropped its lock when it died.
    assert.match(mismatch.stderr, /taking over .*run\.safetensors\.lock: pid \d+ is gone/);
    // Resumed: epoch 2 only, 8 steps of 128 images; the chart holds both epochs.
    const resumed = await run(MNIST, [...flags, "--resume", state]);
    assert.equal(resumed.code, 0, resumed.stderr);
    const final = events(resumed.stdout).at(-1)!;
    assert.equal(final.event, "final", "final is the last line, after plot");
    assert.equal(final.steps, 16);
    assert.equal(final.sessionSteps, 8, "steps/s counts this session's steps only");
    assert.ok((final.stepsPerSecond as number) > 0);
    assert.equal(await chartPoints(chart), 2, "both epochs' points are in the chart");
    // Resuming the finished run: nothing to train, a real accuracy, no NaN and no Infinity.
    const again = await run(MNIST, [...flags, "--resume", state]);
    assert.equal(again.code, 0, again.stderr);
    const report = events(again.stdout).at(-1)!;
    assert.equal(report.testAccuracy, final.testAccuracy, "the same model evaluates the same");
    assert.equal(report.sessionSteps, 0);
    assert.equal(report.stepsPerSecond, null);
    const text = await run(MNIST, flags.filter((f) => f !== "--json").concat("--resume", state));
    assert.equal(text.code, 0, text.stderr);
    assert.doesNotMatch(text.stdout, /NaN|Infinity/);
    assert.match(text.stdout, /nothing left to train/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("examples: a save that fails mid-run is one line; the run stops or goes on as asked", async () => {
  const dir = await Deno.makeTempDir();
  try {
    for (const policy of ["stop", "continue"]) {
      const out = join(dir, policy);
      await Deno.mkdir(out);
      const args = [
        ...QUICK.slice(0, 2),
        "--epochs",
        "2",
        "--save",
        join(out, "run.safetensors"),
        "--on-save-error",
        policy,
        "--json",
      ];
      const r = await afterFirstSave(args, () => out);
      const all = events(r.stdout);
      const failure = all.filter((e) => e.event === "save_error");
      assert.equal(failure.length, 1, `${policy}: one report of the failed save`);
      assert.match(String(failure[0].error), /run\.safetensors/);
      if (policy === "stop") {
        assert.equal(r.code, 1, r.stderr);
        assert.equal(all.at(-1)!.event, "save_error", "nothing after the failure");
      } else {
        // The last save failed: the run trained to its end, and says what the file holds.
        assert.equal(r.code, 1, r.stderr);
        assert.equal(all.at(-1)!.event, "final", "training went on to the end");
        assert.match(
          r.stderr,
          /mnist: 1 save of .*run\.safetensors failed, the last one's included; the last save that succeeded holds epoch 1 \(step 8\)/,
        );
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** The row labels of an --inspect heat map, and its overflow and underflow cells. */
async function heatmapParts(path: string) {
  const svg = await Deno.readTextFile(path);
  return {
    rows: [...svg.matchAll(/<text class="row"[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]),
    overflowCells: svg.match(/class="cell overflow"/g)?.length ?? 0,
    underflowCells: svg.match(/class="cell underflow"/g)?.length ?? 0,
  };
}

/** The heat-map labels the rows of a report should give: "name fwd|bwd", `op:N` as `op`. */
function expectedLabels(rows: Record<string, unknown>[]): string[] {
  const labels = rows.filter((r) => r.op !== "loss_scale").map((r) =>
    `${String(r.name).replace(/:\d+$/, "")} ${r.phase === "forward" ? "fwd" : "bwd"}`
  );
  return [...new Set(labels)];
}

Deno.test("examples: mnist --inspect --json gives the report as an event and a heat map beside --plot", async () => {
  await withTempDir(async (dir) => {
    const plot = join(dir, "loss.svg");
    // 8 AMP steps, logged (and inspected) every 2: 4 columns.
    const args = [...QUICK, "--amp", "--log-every", "2", "--inspect", "--plot", plot, "--json"];
    const r = await run(MNIST, args);
    assert.equal(r.code, 0, r.stderr);
    const all = events(r.stdout);
    assert.equal(all.at(-1)!.event, "final");
    const inspect = all.find((e) => e.event === "inspect")!;
    assert.ok(inspect, "an inspect event");
    assert.equal(inspect.steps, 8);
    assert.equal(inspect.firstNonFinite, null);
    assert.equal(typeof inspect.lossScale, "number");
    assert.equal(inspect.heatmap, join(dir, "loss.numerics.svg"));
    const rows = inspect.rows as Record<string, unknown>[];
    const fields = ["name", "op", "phase", "dtype", "calls", "values", "nonFinite", "overflowF16"];
    for (const row of rows) {
      for (const f of [...fields, "underflowF16", "zeros", "amax"]) assert.ok(f in row, `${f}`);
    }
    // The first Linear's f16 output: one [128, 256] tensor a step, summed over the 4 intervals.
    const first = rows.find((x) => x.name === "0" && x.op === "linear" && x.phase === "forward")!;
    assert.deepEqual([first.dtype, first.calls, first.values], ["f16", 8, 8 * 128 * 256]);
    for (const name of ["0", "2", "4"]) {
      assert.ok(rows.some((x) => x.name === name && x.phase === "backward"), `${name} backward`);
    }
    const params = (inspect.params as { name: string }[]).map((p) => p.name).sort();
    assert.deepEqual(params, ["0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"]);
    const ops = inspect.ops as { op: string; calls: Record<string, number> }[];
    assert.equal(ops.find((o) => o.op === "linear")?.calls.f16, 3 * 8, "three Linears, 8 steps");
    const map = await heatmapParts(join(dir, "loss.numerics.svg"));
    assert.deepEqual(map.rows, expectedLabels(rows));
    assert.equal(map.overflowCells, map.rows.length * 4, "a cell per layer × bucket");
    assert.equal(map.underflowCells, map.rows.length * 4);
  });
});

Deno.test("examples: tiny_gpt --inspect prints the worst rows at the end, and where a diverged run broke", async () => {
  await withTempDir(async (dir) => {
    const plot = join(dir, "loss.svg");
    const quick = ["--steps", "4", "--log-every", "2", "--eval-windows", "8", "--samples", "1"];
    const r = await run(TINY_GPT, [...quick, "--inspect", "--plot", plot]); // f32, text
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.split("\n");
    const at = lines.findIndex((l) => l.startsWith("numerics (--inspect)"));
    assert.match(lines[at], /^numerics \(--inspect\) over 4 steps: first NaN\/Inf none$/);
    assert.match(
      lines[at + 1],
      /^layer\s+op\s+phase\s+dtype\s+NaN\/Inf\s+overflow\s+underflow\s+zeros\s+amax$/,
    );
    const table = lines.slice(at + 2, at + 12);
    assert.match(lines[at + 12], /^\(10 of \d+ rows; /);
    assert.match(lines[at + 13], /^gradients underflowing f16: /, "no loss scale in f32");
    // Nothing overflows here: the rows come by underflow share, largest first.
    const shares = table.map((l) => {
      const cells = l.split(/\s+/);
      assert.equal(cells[4], "0", l);
      return cells[6] === "0" ? 0 : parseFloat(cells[6]);
    });
    assert.deepEqual(shares, [...shares].sort((a, b) => b - a), table.join("\n"));
    const map = await heatmapParts(join(dir, "loss.numerics.svg"));
    assert.ok(map.rows.includes("blocks.0.attention fwd") && map.rows.includes("head bwd"));
    assert.equal(map.overflowCells, map.rows.length * 2, "a cell per layer × bucket");

    // Diverged (exit 3): the report still comes, naming the first op that made a NaN/Inf.
    const bad = await run(TINY_GPT, [
      ...quick,
      "--steps",
      "12",
      "--log-every",
      "4",
      "--lr",
      "1e30",
      "--inspect",
      "--json",
    ]);
    assert.equal(bad.code, 3, bad.stderr);
    const inspect = events(bad.stdout).find((e) => e.event === "inspect")!;
    const first = inspect.firstNonFinite as { step: number; name: string; phase: string };
    assert.ok(first.step >= 1 && first.step <= 4, `step ${first.step} of the 4 before the log`);
    assert.ok((inspect.rows as { name: string }[]).some((x) => x.name === first.name));
    assert.ok((inspect.rows as { nonFinite: number }[]).some((x) => x.nonFinite > 0));
  });
});

Deno.test("tiny_gpt flags: nanoGPT's options reach the model's config; a bad --gelu is a usage error", () => {
  const cfg = parseTinyGptArgs([
    "--tie-embeddings",
    "--no-head-bias",
    "--no-bias",
    "--gelu",
    "tanh",
  ])!;
  assert.deepEqual(
    [cfg.tieEmbeddings, cfg.headBias, cfg.bias, cfg.gelu, cfg.saveNanoGpt],
    [true, false, false, "tanh", undefined],
  );
  const plain = parseTinyGptArgs([])!;
  assert.deepEqual([plain.tieEmbeddings, plain.headBias, plain.bias, plain.gelu], [
    false,
    true,
    true,
    "none",
  ]);
  assert.throws(
    () => parseTinyGptArgs(["--gelu", "erf"]),
    (e: unknown) =>
      e instanceof UsageError && e.message === '--gelu must be none (exact) or tanh, got "erf".',
  );
});
