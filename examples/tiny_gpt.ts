/**
 * Trains a tiny decoder-only transformer (GPT) on English words, one
 * character at a time, with AdamW through `AmpTrainer`, and reports the
 * validation loss against a bigram baseline, speed, peak GPU memory and a few
 * sampled words. Uses only the public API of `mod.ts`.
 *
 *     XDG_RUNTIME_DIR=/tmp deno run -A examples/tiny_gpt.ts [--amp] [--checkpoint] [--json] ...
 *
 * Run with `--help` for every flag. Training never waits for the GPU except
 * to log (every `--log-every` steps); evaluation reads one sum at the end and
 * sampling reads the logits of every generated character (it runs on the CPU).
 *
 * @module
 */
import {
  AdamW,
  addInPlace,
  AmpTrainer,
  autocast,
  cosineSchedule,
  crossEntropy,
  initGpu,
  LrScheduler,
  noGrad,
  RandomGenerator,
  Tensor,
  tidy,
} from "../mod.ts";
import { TinyGpt } from "./tiny_gpt_model.ts";
import { type PlotPoint, writeLossChart } from "./_plot.ts";
import { parseTinyGptArgs, TINY_GPT_HELP, type TinyGptArgs, UsageError } from "./tiny_gpt_args.ts";
import {
  bigramCrossEntropy,
  evaluationWindows,
  loadEnglishWords,
  NEWLINE,
  sampleBatch,
  splitWords,
} from "./words_data.ts";

/** Mean cross-entropy (nats per character) over evaluation windows; one sync at the end. */
async function validationLoss(
  model: TinyGpt,
  windows: { inputs: Int32Array; targets: Int32Array; count: number },
  cfg: TinyGptArgs,
): Promise<number> {
  model.eval();
  const total = Tensor.zeros([]);
  for (let w = 0; w < windows.count; w += cfg.batch) {
    const n = Math.min(cfg.batch, windows.count - w);
    const span = [w * cfg.context, (w + n) * cfg.context];
    noGrad(() =>
      tidy(() => {
        const ids = Tensor.from(windows.inputs.subarray(span[0], span[1]), [n, cfg.context], {
          dtype: "i32",
        });
        const targets = windows.targets.subarray(span[0], span[1]);
        const loss = autocast(
          () => crossEntropy(model.forward(ids), targets, { reduction: "sum" }),
          {
            enabled: cfg.amp,
          },
        );
        addInPlace(total, loss);
      })
    );
  }
  const nats = await total.item(); // the sync point
  total.dispose();
  model.train();
  return nats / (windows.count * cfg.context);
}

/** Samples `cfg.samples` words at `cfg.temperature`, all at once; syncs once per character. */
async function sampleWords(
  model: TinyGpt,
  vocab: string[],
  cfg: TinyGptArgs,
): Promise<string[]> {
  model.eval();
  const rng = new RandomGenerator(cfg.seed + 2);
  const newline = vocab.indexOf(NEWLINE);
  const seqs = Array.from({ length: cfg.samples }, () => [newline]);
  const done = seqs.map(() => false);
  for (let t = 1; t <= cfg.context && done.includes(false); t++) {
    const ids = seqs.flat();
    const logits = noGrad(() =>
      tidy(() =>
        autocast(() => model.forward(Tensor.from(ids, [cfg.samples, t], { dtype: "i32" })), {
          enabled: cfg.amp,
        })
      )
    );
    const values = await logits.read(); // [samples·t, V]
    logits.dispose();
    const draws = rng.uniform(cfg.samples);
    for (let s = 0; s < cfg.samples; s++) {
      const row = values.subarray(((s + 1) * t - 1) * vocab.length, (s + 1) * t * vocab.length);
      let next = newline;
      if (!done[s]) {
        const m = Math.max(...row);
        const p = Array.from(row, (v) => Math.exp((v - m) / cfg.temperature));
        let u = draws[s] * p.reduce((a, b) => a + b, 0);
        next = p.findIndex((q) => (u -= q) < 0);
        if (next < 0) next = p.length - 1;
      }
      seqs[s].push(next);
      if (next === newline) done[s] = true;
    }
  }
  model.train();
  return seqs.map((s) => s.slice(1).map((i) => vocab[i]).join("").split(NEWLINE)[0]);
}

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

async function main(): Promise<void> {
  const started = performance.now();
  let cfg: TinyGptArgs | null;
  try {
    cfg = parseTinyGptArgs(Deno.args);
  } catch (e) {
    if (!(e instanceof UsageError || e instanceof TypeError)) throw e;
    console.error(`tiny_gpt: ${e.message}\nRun with --help for the flags.`);
    Deno.exit(2);
  }
  if (cfg === null) {
    console.log(TINY_GPT_HELP.trimEnd());
    return;
  }
  const c = cfg;
  const emit = (event: string, fields: Record<string, unknown>, text: string) =>
    console.log(c.json ? JSON.stringify({ event, ...fields }) : text);

  const corpus = splitWords(await loadEnglishWords(), { seed: c.seed });
  const windows = evaluationWindows(corpus.validation, c.context, c.evalWindows);
  const bigram = bigramCrossEntropy(
    corpus.train,
    windows.inputs,
    windows.targets,
    corpus.vocab.length,
  );
  const gpu = await initGpu();
  const setupSeconds = (performance.now() - started) / 1000;
  const model = new TinyGpt({ ...c, vocab: corpus.vocab.length, seed: c.seed });
  if (c.checkpoint) model.blocks.checkpoint = c.layers; // one checkpointed segment per block
  const parameters = model.parameters().reduce((n, p) => n + p.size, 0);
  emit(
    "start",
    {
      adapter: gpu.adapterName,
      f16: gpu.f16,
      ...c,
      vocab: corpus.vocab.length,
      parameters,
      trainChars: corpus.train.length,
      validationWords: corpus.validationWords,
      validationChars: windows.count * c.context,
      bigramLoss: bigram,
      setupSeconds,
    },
    [
      `adapter: ${gpu.adapterName}; words: ${corpus.trainWords.size} train / ${corpus.validationWords} ` +
      `held out (${corpus.train.length} training characters, vocab ${corpus.vocab.length})`,
      `GPT: ${c.layers} blocks, dim ${c.dim}, ${c.heads} heads, context ${c.context}, ` +
      `${parameters} parameters; ${c.amp ? "AMP (f16 + loss scaling)" : "f32"}` +
      `${
        c.checkpoint ? ", checkpointed blocks" : ""
      }; AdamW lr ${c.lr}, batch ${c.batch}, ${c.steps} steps`,
      `bigram baseline (add-one, from the training split): ${bigram.toFixed(4)} nats/char on ` +
      `${windows.count * c.context} validation characters`,
    ].join("\n"),
  );

  const optimizer = new AdamW(model.parameters(), { lr: c.lr, weightDecay: 0.01 });
  const trainer = new AmpTrainer(model, optimizer, { enabled: c.amp, maxGradNorm: 1 });
  const warmupSteps = Math.min(c.warmup, c.steps);
  const scheduler = new LrScheduler(
    optimizer,
    cosineSchedule({ warmupSteps, totalSteps: c.steps, minFactor: 0.1 }),
  );
  const rng = new RandomGenerator(c.seed + 1);
  const inputs = new Int32Array(c.batch * c.context), targets = new Int32Array(c.batch * c.context);
  let lossSum = Tensor.zeros([]), lossCount = 0, lastLoss = NaN;
  const plotPoints: PlotPoint[] = [];
  const allocated: number[] = [];
  gpu.resetPeakMemory();
  const trainStart = performance.now();
  let intervalStart = trainStart;
  for (let step = 1; step <= c.steps; step++) {
    sampleBatch(corpus.train, c.context, rng, inputs, targets);
    const loss = trainer.step(() =>
      crossEntropy(
        model.forward(Tensor.from(inputs, [c.batch, c.context], { dtype: "i32" })),
        targets,
      )
    );
    scheduler.step();
    noGrad(() => addInPlace(lossSum, loss));
    loss.dispose();
    lossCount++;
    if (step === 10 || step === c.steps) allocated.push(gpu.memoryStats().allocatedBytes);
    if (step % c.logEvery === 0 || step === c.steps) {
      lastLoss = (await lossSum.item()) / lossCount; // the sync point
      // Reading the scale is a sync too: only when a chart wants it.
      if (c.plot) {
        plotPoints.push({ step, loss: lastLoss, lossScale: await trainer.scaler.getScale() });
      }
      const now = performance.now(), stepsPerSecond = lossCount / ((now - intervalStart) / 1000);
      emit(
        "step",
        { step, loss: lastLoss, stepsPerSecond },
        `step ${String(step).padStart(5)}/${c.steps}  train loss ${lastLoss.toFixed(4)}  ` +
          `${stepsPerSecond.toFixed(2)} steps/s`,
      );
      lossSum.dispose();
      lossSum = Tensor.zeros([]);
      lossCount = 0;
      intervalStart = now;
    }
  }
  lossSum.dispose();
  const trainSeconds = (performance.now() - trainStart) / 1000;
  const trainPeak = gpu.memoryStats().peakBytes;

  const evalStart = performance.now();
  const validation = await validationLoss(model, windows, c);
  const evalSeconds = (performance.now() - evalStart) / 1000;
  const samples = await sampleWords(model, corpus.vocab, c);
  const novel = samples.filter((w) => !corpus.trainWords.has(w)).length;
  const lossScale = await trainer.scaler.getScale(), skipped = await trainer.scaler.skippedSteps();
  const wallSeconds = (performance.now() - started) / 1000;
  const final = {
    validationLoss: validation,
    bigramLoss: bigram,
    improvement: bigram - validation,
    finalTrainLoss: lastLoss,
    steps: c.steps,
    stepsPerSecond: c.steps / trainSeconds,
    tokensPerSecond: (c.steps * c.batch * c.context) / trainSeconds,
    trainSeconds,
    evalSeconds,
    wallSeconds,
    peakBytes: trainPeak,
    memoryFlat: allocated.every((b) => b === allocated[0]),
    amp: trainer.masters !== null,
    checkpoint: c.checkpoint,
    lossScale,
    skippedSteps: skipped,
    samples,
    novelSamples: novel,
  };
  emit(
    "final",
    final,
    [
      `validation loss ${validation.toFixed(4)} nats/char vs bigram ${bigram.toFixed(4)} ` +
      `(${(bigram - validation).toFixed(4)} better); final train loss ${lastLoss.toFixed(4)}`,
      `${final.stepsPerSecond.toFixed(2)} steps/s (${
        final.tokensPerSecond.toFixed(0)
      } tokens/s), ` +
      `training ${trainSeconds.toFixed(1)} s, evaluation ${evalSeconds.toFixed(2)} s, wall ${
        wallSeconds.toFixed(1)
      } s`,
      `peak GPU memory in training: ${mib(trainPeak)}${
        final.memoryFlat ? "" : " (allocated bytes grew between steps: a leak)"
      }; loss scale ${lossScale}, ${skipped} skipped steps`,
      `samples (temperature ${c.temperature}; ${novel}/${samples.length} not in the training words): ` +
      samples.join(", "),
    ].join("\n"),
  );
  if (c.plot) {
    await writeLossChart(c.plot, plotPoints, `tiny GPT, ${c.amp ? "AMP" : "f32"}`);
    emit("plot", { path: c.plot }, `wrote ${c.plot}`);
  }
  model.dispose();
  trainer.dispose();
  optimizer.dispose();
  if (!final.memoryFlat) Deno.exit(1);
}

if (import.meta.main) await main();
