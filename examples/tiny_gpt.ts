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
import { orExit, orExitAsync, runMain } from "./cli/flags.ts";
import { readUtf8 } from "./data/text_file.ts";
import { checkOutputFiles, type OutputFile } from "./runs/outputs.ts";
import { DivergenceWatch, evaluationHealth, type Health } from "./cli/divergence.ts";
import { trainingStep } from "./cli/capture_flag.ts";
import { finishInspect, heatmapPath, InspectLog } from "./cli/inspect.ts";
import { checkPlan, runLimits } from "./cli/preflight.ts";
import { profileFields, ProfileWindow } from "./cli/profile_window.ts";
import { FirstStep, Progress } from "./cli/progress.ts";
import {
  AdamW,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  type Gpu,
  initGpu,
  LrScheduler,
  noGrad,
  RandomGenerator,
  Tensor,
  tidy,
} from "../mod.ts";
import { saveSafetensors } from "../files.ts";
import { Gpt } from "../models/mod.ts";
import { tinyGptBuffers } from "./tiny_gpt/buffers.ts";
import type { Emit, Run, Training } from "./tiny_gpt/run.ts";
import { toNanoGpt } from "../models/mod.ts";
import type { PlotPoint } from "./plots/loss_chart.ts";
import { report, reportStart } from "./tiny_gpt/report.ts";
import {
  parseTinyGptArgs,
  TINY_GPT_HELP,
  TINY_GPT_SIZES,
  type TinyGptArgs,
  UsageError,
} from "./tiny_gpt/args.ts";
import {
  bigramCrossEntropy,
  evaluationWindows,
  NEWLINE,
  sampleBatch,
  splitWords,
  textCorpus,
} from "./data/words.ts";
import { loadEnglishWords } from "./data/english_words.ts";

/** The files the run writes, for the one output rule (examples/runs/outputs.ts). */
function outputs(cfg: TinyGptArgs): OutputFile[] {
  const files: OutputFile[] = [];
  if (cfg.plot) {
    files.push({ flag: "plot", path: cfg.plot });
    if (cfg.inspect) {
      files.push({ flag: "plot", what: "the heat map", path: heatmapPath(cfg.plot) });
    }
  }
  if (cfg.saveNanoGpt) files.push({ flag: "save-nanogpt", path: cfg.saveNanoGpt });
  return files;
}

/**
 * The flags, or null after printing --help; a bad flag, or an output that
 * cannot be written or would replace a file unasked (examples/runs/outputs.ts),
 * is one line and exit status 2, before any training.
 */
async function parseFlags(args: string[]): Promise<TinyGptArgs | null> {
  let cfg: TinyGptArgs | null;
  try {
    cfg = parseTinyGptArgs(args);
    const inputs = cfg?.data ? [{ flag: "data", path: cfg.data }] : [];
    if (cfg) await checkOutputFiles(outputs(cfg), { inputs, overwrite: cfg.overwrite });
  } catch (e) {
    if (!(e instanceof UsageError || e instanceof TypeError)) throw e;
    console.error(`tiny_gpt: ${e.message} (see --help)`);
    Deno.exit(2);
  }
  if (cfg === null) console.log(TINY_GPT_HELP.trimEnd());
  return cfg;
}

/**
 * The words split by `--seed` (or `--data`'s text, split in order), the
 * validation windows and the bigram baseline on them. A text too short for
 * one window per part is exit status 2; a file that cannot be read, 1.
 */
async function loadData(cfg: TinyGptArgs) {
  const corpus = cfg.data
    ? textCorpus(await readText(cfg.data))
    : splitWords(await loadEnglishWords(), { seed: cfg.seed });
  if (Math.min(corpus.train.length, corpus.validation.length) < cfg.context + 1) {
    console.error(
      `tiny_gpt: --data ${cfg.data}: ${corpus.train.length} training and ` +
        `${corpus.validation.length} held-out characters; each part needs --context + 1 = ` +
        `${cfg.context + 1} (give more text, or lower --context).`,
    );
    Deno.exit(2);
  }
  const windows = evaluationWindows(corpus.validation, cfg.context, cfg.evalWindows);
  const bigram = bigramCrossEntropy(
    corpus.train,
    windows.inputs,
    windows.targets,
    corpus.vocab.length,
  );
  return { corpus, windows, bigram };
}

/**
 * `--data`'s text (UTF-8); one that is not UTF-8 text is one line and exit
 * status 2, one that cannot be read exit status 1 (runMain).
 */
function readText(path: string): Promise<string> {
  return orExitAsync("tiny_gpt", () => readUtf8("data", path));
}

/**
 * `--steps` optimizer steps on random windows of the training stream, with a
 * cosine schedule after `--warmup` steps. Reads the loss back (a sync) only
 * every `--log-every` steps.
 */
async function train(run: Run): Promise<Training> {
  const { cfg: c, gpu, model, trainer } = run;
  const scheduler = new LrScheduler(
    run.optimizer,
    cosineSchedule({
      warmupSteps: Math.min(c.warmup, c.steps),
      totalSteps: c.steps,
      minFactor: 0.1,
    }),
  );
  const rng = new RandomGenerator(c.seed + 1);
  const inputs = new Int32Array(c.batch * c.context), targets = new Int32Array(c.batch * c.context);
  let lossSum = Tensor.zeros([]), lossCount = 0, lastLoss = NaN;
  const plotPoints: PlotPoint[] = [];
  gpu.resetPeakMemory();
  const trainStart = performance.now();
  let intervalStart = trainStart;
  const watch = await DivergenceWatch.start(trainer);
  const progress = new Progress(!c.json);
  let barText = "training"; // the last logged loss replaces it
  const first = new FirstStep(run.emit, c.logEvery);
  for (let step = 1; step <= c.steps; step++) {
    sampleBatch(run.corpus.train, c.context, rng, inputs, targets);
    run.profile?.before(step);
    first.before();
    // The batch goes from host arrays straight into the step's input buffers.
    const loss = run.step.run(
      { data: inputs, shape: [c.batch, c.context], dtype: "i32" },
      { data: targets, shape: [c.batch * c.context], dtype: "i32" },
    );
    first.after();
    scheduler.step();
    noGrad(() => addInPlace(lossSum, loss));
    loss.dispose();
    lossCount++;
    const report = await run.profile?.after(step);
    if (report) {
      const { first, last } = run.profile!;
      run.emit("profile", profileFields(report, first, last), report.table());
    }
    if (step % c.logEvery === 0 || step === c.steps) {
      lastLoss = (await lossSum.item()) / lossCount; // the sync point
      // Reading the scale is a sync too: only when a chart wants it.
      if (c.plot) {
        plotPoints.push({ step, loss: lastLoss, lossScale: await trainer.scaler.getScale() });
      }
      const now = performance.now(), stepsPerSecond = lossCount / ((now - intervalStart) / 1000);
      barText = `train loss ${lastLoss.toFixed(4)}  ${stepsPerSecond.toFixed(2)} steps/s`;
      const eta = progress.eta(step, c.steps);
      if (!progress.isBar) {
        run.emit(
          "step",
          { step, loss: lastLoss, stepsPerSecond },
          `step ${String(step).padStart(5)}/${c.steps}  ${barText}${eta ? `  ${eta}` : ""}`,
        );
      }
      await run.inspect?.interval(step); // --inspect: its counts since the last log (one more read)
      lossSum.dispose();
      lossSum = Tensor.zeros([]);
      lossCount = 0;
      await stopIfDiverged(run, await watch.check(lastLoss, model.parameters()), step);
      intervalStart = performance.now(); // the check's read is not training time
    }
    progress.update(step, c.steps, barText); // every step: no silence until the next log
  }
  progress.finish();
  lossSum.dispose();
  const trainSeconds = (performance.now() - trainStart) / 1000;
  return { lastLoss, trainSeconds, trainPeak: gpu.memoryStats().peakBytes, plotPoints };
}

/**
 * Mean cross-entropy (nats per character) over the validation windows, with
 * the trainer's precision; one sync at the end.
 */
async function evaluate(run: Run): Promise<number> {
  const { cfg, model, trainer, windows } = run;
  model.eval();
  const total = Tensor.zeros([]);
  const progress = new Progress(!cfg.json);
  if (!progress.isBar) {
    run.emit(
      "phase",
      { phase: "evaluate", windows: windows.count },
      `evaluating: ${windows.count} validation windows of ${cfg.context} characters...`,
    );
  }
  for (let w = 0; w < windows.count; w += cfg.batch) {
    const n = Math.min(cfg.batch, windows.count - w);
    const span = [w * cfg.context, (w + n) * cfg.context];
    noGrad(() =>
      tidy(() => {
        const ids = Tensor.from(windows.inputs.subarray(span[0], span[1]), [n, cfg.context], {
          dtype: "i32",
        });
        const targets = windows.targets.subarray(span[0], span[1]);
        const loss = trainer.autocast(() =>
          crossEntropy(model.forward(ids), targets, { reduction: "sum" })
        );
        addInPlace(total, loss);
      })
    );
    progress.update(w + n, windows.count, "evaluating (validation windows)");
  }
  progress.finish();
  const nats = await total.item(); // the sync point
  total.dispose();
  model.train();
  return nats / (windows.count * cfg.context);
}

/** Samples `--samples` words at `--temperature`, all at once; syncs once per character. */
async function sampleWords(run: Run): Promise<string[]> {
  const { cfg, model, trainer } = run, vocab = run.corpus.vocab;
  model.eval();
  const rng = new RandomGenerator(cfg.seed + 2);
  const newline = vocab.indexOf(NEWLINE);
  const seqs = Array.from({ length: cfg.samples }, () => [newline]);
  const done = seqs.map(() => false);
  run.emit("phase", { phase: "sample", words: cfg.samples }, `sampling ${cfg.samples} words...`);
  for (let t = 1; t <= cfg.context && done.includes(false); t++) {
    const ids = seqs.flat();
    const logits = noGrad(() =>
      tidy(() =>
        trainer.autocast(() => model.forward(Tensor.from(ids, [cfg.samples, t], { dtype: "i32" })))
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

/**
 * At a logged loss (already a sync): stops the run with exit status 3 when
 * training diverged, and passes a warning on (most steps skipped). One more
 * read: the weights' sum.
 */
async function stopIfDiverged(run: Run, health: Health, step: number) {
  if (health.warning) {
    run.emit("warning", { step, warning: health.warning }, `step ${step}: ${health.warning}`);
  }
  if (!health.diverged) return;
  // --inspect says where it broke: the first op whose output or gradient held a NaN/Inf.
  if (run.inspect) await finishInspect(run.inspect, inspectOutput(run));
  console.error(`tiny_gpt: training diverged at step ${step}: ${health.diverged}.`);
  run.gpu.destroy();
  Deno.exit(3);
}

/** Where --inspect's report goes: the events, and the heat map beside --plot. */
function inspectOutput({ cfg, emit }: Run) {
  const title = `tiny GPT (${cfg.layers} blocks, dim ${cfg.dim}), ${cfg.amp ? "AMP" : "f32"}: ` +
    "values f16 cannot hold";
  return { emit, plot: cfg.plot, title };
}

/**
 * Exits with status 2, before the model is built, when a buffer of training,
 * evaluation or sampling exceeds this adapter's limit or the weights the host's memory.
 */
function checkFits(cfg: TinyGptArgs, gpu: Gpu, vocab: number): void {
  const plan = tinyGptBuffers({ ...cfg, vocab }, cfg);
  orExit("tiny_gpt", () => checkPlan(plan, runLimits(gpu), TINY_GPT_SIZES));
}

async function main(): Promise<void> {
  const started = performance.now();
  const cfg = await parseFlags(Deno.args);
  if (cfg === null) return; // --help
  const emit: Emit = (event, fields, text) =>
    console.log(cfg.json ? JSON.stringify({ event, ...fields }) : text);
  const data = await loadData(cfg);
  const gpu = await initGpu({ backend: cfg.backend });
  const setupSeconds = (performance.now() - started) / 1000;
  checkFits(cfg, gpu, data.corpus.vocab.length);
  const model = new Gpt({ ...cfg, vocab: data.corpus.vocab.length, seed: cfg.seed });
  if (cfg.checkpoint) model.blocks.checkpoint = cfg.layers; // one checkpointed segment per block
  reportStart({ cfg, emit, gpu, ...data, model }, setupSeconds);
  const optimizer = new AdamW(model.parameters(), {
    lr: cfg.lr,
    weightDecay: 0.01,
    stateDtype: cfg.optimStates,
  });
  // --inspect: every step of the trainer is watched (counted on the GPU, read when logging).
  const inspect = cfg.inspect ? new InspectLog(model) : null;
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: cfg.amp,
    dtype: cfg.ampDtype,
    maxGradNorm: 1,
    gradDtype: cfg.gradDtype,
    inspector: inspect?.inspector,
  });
  const profile = cfg.profile ? new ProfileWindow(gpu, cfg.profile, cfg.steps) : null;
  // Captured (recorded in its first steps, then replayed): the same bits as uncaptured.
  const step = trainingStep(trainer, (x, y) => crossEntropy(model.forward(x), y), cfg);
  const run: Run = { cfg, emit, gpu, ...data, model, optimizer, trainer, step, profile, inspect };
  const training = await train(run);
  const evalStart = performance.now();
  const validation = await evaluate(run);
  await stopIfDiverged(run, evaluationHealth(validation, trainer), cfg.steps);
  const evalSeconds = (performance.now() - evalStart) / 1000;
  const samples = await sampleWords(run);
  if (inspect) {
    await finishInspect(inspect, inspectOutput(run));
    inspect.dispose();
  }
  if (cfg.saveNanoGpt) {
    await saveSafetensors(cfg.saveNanoGpt, toNanoGpt(model));
    emit(
      "saved",
      { path: cfg.saveNanoGpt, layout: "nanogpt" },
      `saved ${cfg.saveNanoGpt} (nanoGPT's names)`,
    );
  }
  await report(run, training, { validation, evalSeconds, samples }, started);
  model.dispose();
  trainer.dispose();
  optimizer.dispose();
}

if (import.meta.main) await runMain("tiny_gpt", main);
