/**
 * Fine-tunes GPT-2 (Hugging Face's published model.safetensors) on a text
 * file and samples from it, with AdamW through `AmpTrainer`: `--amp`,
 * `--amp bf16`, `--checkpoint`, `--accum`, a warmup + cosine schedule,
 * validation loss, `--save` / `--resume`, and a KV cache for sampling. The
 * head and its cross-entropy run in chunks of rows (`linearCrossEntropy`), so
 * the logits [B·T, 50257] are never whole. See docs/gpt2.md.
 *
 *     deno run -A examples/gpt2.ts --weights model.safetensors --data my.txt --amp
 *     deno run -A examples/gpt2.ts --weights model.safetensors --prompt "Hello" --temperature 0
 *
 * Run with `--help` for every flag. Training waits for the GPU only to log
 * (every `--log-every` steps), to validate and to save.
 *
 * @module
 */
import {
  AdamW,
  addInPlace,
  AmpTrainer,
  cosineSchedule,
  type Gpu,
  initGpu,
  LrScheduler,
  noGrad,
  RandomGenerator,
  type SafetensorsEntry,
  Tensor,
  tidy,
} from "../mod.ts";
import { loadSafetensors, loadTrainingState, saveTrainingState } from "../files.ts";
import { checkOutputPath, orExit, orExitAsync, reason, runMain, UsageError } from "./_cli.ts";
import { DivergenceWatch, evaluationHealth, type Health } from "./_divergence.ts";
import { checkPlan, runLimits } from "./_preflight.ts";
import { Progress } from "./_progress.ts";
import {
  checkResumeFlags,
  describeChanges,
  type FlagChange,
  type FlagValues,
} from "./_resume_flags.ts";
import { checkSaveTarget, readRecordOrExit, type RunRecordKind } from "./_run_file.ts";
import { SaveLock } from "./_save_lock.ts";
import { precisionDetail } from "./_amp_flag.ts";
import { GPT2_HELP, GPT2_SIZES, type Gpt2Args, parseGpt2Args } from "./gpt2_args.ts";
import { loadTextTokens, type TokenSplit } from "./gpt2_data.ts";
import { generate } from "./gpt2_generate.ts";
import { gpt2Buffers, gpt2Parameters } from "./gpt2_memory.ts";
import { decodeGpt2, encodeGpt2 } from "./gpt2_tokenizer.ts";
import {
  fromHuggingFace,
  GPT2_124M,
  gpt2Config,
  type Gpt2JsonConfig,
  type Gpt2Sizes,
  gpt2SizesOf,
  headsOf,
  initGpt2,
  saveGpt2,
} from "./gpt2_weights.ts";
import { TinyGpt } from "./tiny_gpt_model.ts";
import { evaluationWindows, sampleBatch } from "./words_data.ts";

/** Prints one event: a JSON line with --json, else `text`. */
type Emit = (event: string, fields: Record<string, unknown>, text: string) => void;

/** The published sizes by --random's names. */
const RANDOM_SIZES: Record<string, Gpt2Sizes> = {
  "124M": GPT2_124M,
  "355M": { ...GPT2_124M, layers: 24, dim: 1024, heads: 16 },
  "774M": { ...GPT2_124M, layers: 36, dim: 1280, heads: 20 },
  "1.5B": { ...GPT2_124M, layers: 48, dim: 1600, heads: 25 },
};

/** A fine-tuning run: the flags, the data and what trains. */
interface Run {
  cfg: Gpt2Args;
  emit: Emit;
  gpu: Gpu;
  data: TokenSplit;
  model: TinyGpt;
  optimizer: AdamW;
  trainer: AmpTrainer;
  scheduler: LrScheduler;
  /** Draws the training windows; saved with the run. */
  batches: RandomGenerator;
}

/** The flags, or null after --help; a bad flag is one line and exit status 2. */
async function parseFlags(args: string[]): Promise<Gpt2Args | null> {
  const cfg = orExit("gpt2", () => {
    try {
      return parseGpt2Args(args);
    } catch (e) {
      if (e instanceof TypeError) throw new UsageError(`${e.message} (see --help)`);
      throw e;
    }
  });
  if (cfg === null) {
    console.log(GPT2_HELP.trimEnd());
    return null;
  }
  for (const [flag, path] of [["save", cfg.save], ["save-weights", cfg.saveWeights]] as const) {
    if (path) {
      await checkOutputPath(flag, path).catch((e) =>
        orExit("gpt2", () => {
          throw e;
        })
      );
    }
  }
  return cfg;
}

/** The weights file's entries and config.json (none for --random), read once. */
async function readWeights(cfg: Gpt2Args) {
  if (!cfg.weights) return { entries: null, json: undefined, bytes: 0, heads: undefined };
  let entries: Map<string, SafetensorsEntry>, heads: number | undefined;
  try {
    const file = await loadSafetensors(cfg.weights);
    entries = file.entries;
    heads = cfg.heads ?? headsOf(file.metadata);
  } catch (e) {
    console.error(`gpt2: --weights ${cfg.weights}: ${reason(e)}`);
    Deno.exit(1);
  }
  const slash = cfg.weights.lastIndexOf("/");
  const beside = `${slash < 0 ? "." : cfg.weights.slice(0, slash) || "/"}/config.json`;
  let json: Gpt2JsonConfig | undefined;
  try {
    json = JSON.parse(await Deno.readTextFile(beside));
  } catch {
    json = undefined; // none beside it: the sizes come from the tensors
  }
  const bytes = [...entries.values()].reduce((n, e) => n + e.data.byteLength, 0);
  return { entries, json, bytes, heads };
}

/** The model: the file's weights, or a random GPT-2 of --random's size. Exit 2 for a wrong file. */
function buildModel(
  cfg: Gpt2Args,
  weights: Awaited<ReturnType<typeof readWeights>>,
  maxBufferBytes: number,
): { model: TinyGpt; sizes: Gpt2Sizes } {
  if (!weights.entries) {
    const sizes = RANDOM_SIZES[cfg.random!];
    const model = new TinyGpt(gpt2Config(sizes, cfg.seed, maxBufferBytes));
    initGpt2(model, cfg.seed);
    return { model, sizes };
  }
  const entries = weights.entries;
  return orExit("gpt2", () => {
    try {
      const sizes = gpt2SizesOf(entries, { json: weights.json, heads: weights.heads });
      const config = gpt2Config(sizes, cfg.seed, maxBufferBytes);
      const state = fromHuggingFace(entries, config.tableShards);
      const model = new TinyGpt(config);
      model.loadStateDict(state);
      return { model, sizes };
    } catch (e) {
      throw new UsageError(`--weights ${cfg.weights}: ${reason(e)}`);
    }
  });
}

/** The flags a saved run records: those a resumed run must repeat, and those --override may change. */
function runFlags(cfg: Gpt2Args): { shape: FlagValues; steering: FlagValues } {
  return {
    shape: {
      weights: cfg.weights ?? `random ${cfg.random}`,
      data: cfg.data!,
      steps: cfg.steps,
      batch: cfg.batch,
      accum: cfg.accum,
      context: cfg.context,
      warmup: cfg.warmup,
      validation: cfg.validation,
      amp: cfg.amp && cfg.ampDtype === "bf16" ? "bf16" : cfg.amp,
      seed: cfg.seed,
    },
    steering: { lr: cfg.lr },
  };
}

/** What --save writes besides the model, optimizer and trainer (the training state's `extra`). */
interface SavedRun {
  step: number;
  batches: { seed: number; offset: number };
  flags: { shape: FlagValues; steering: FlagValues };
}

/** gpt2.ts's record in a parsed `extra`, or null when it is not one. */
function savedRunOf(extra: unknown): SavedRun | null {
  const r = extra as SavedRun | null;
  const count = (x: unknown) => Number.isSafeInteger(x) && (x as number) >= 0;
  const object = (x: unknown) => typeof x === "object" && x !== null;
  const ok = object(r) && count(r!.step) && object(r!.batches) && count(r!.batches.seed) &&
    count(r!.batches.offset) && object(r!.flags) && object(r!.flags.shape);
  return ok ? r : null;
}

/** What gpt2.ts keeps in a training state, for the checks before start-up (`_run_file.ts`). */
const GPT2_RUN: RunRecordKind<SavedRun> = {
  script: "gpt2.ts",
  holds: "step, data order",
  recordOf: savedRunOf,
  describe: (r) => `step ${r.step}`,
  replaced: "at the first good validation",
};

/**
 * Restores the run `record` came from (checked before start-up, with the
 * flag `changes` --override accepted); returns the step to go on from.
 * Exits with status 1, in one line, when the file does not fit the model.
 */
async function resumeOrStart(
  run: Run,
  record: SavedRun | null,
  changes: FlagChange[],
): Promise<number> {
  const { cfg, model, optimizer, trainer } = run;
  if (!cfg.resume || !record) return 0;
  await loadTrainingState(cfg.resume, { model, optimizer, trainer }).catch((e) => {
    console.error(`gpt2: cannot resume: ${reason(e)}`);
    run.gpu.destroy();
    Deno.exit(1);
  });
  const path = cfg.resume;
  if (changes.length > 0) {
    run.emit("override", { changes }, `--override: resuming with ${describeChanges(changes)}`);
  }
  run.scheduler.step(trainer.steps);
  run.batches = new RandomGenerator(record.batches.seed, record.batches.offset);
  run.emit("resume", { path, step: record.step }, `resumed ${path} after step ${record.step}`);
  return record.step;
}

/** Saves the whole run to --save (atomic; exit 1 when it cannot be written). */
async function save(run: Run, step: number): Promise<void> {
  const { cfg, model, optimizer, trainer, scheduler } = run;
  const extra: SavedRun = { step, batches: run.batches.state(), flags: runFlags(cfg) };
  try {
    await saveTrainingState(cfg.save!, { model, optimizer, trainer, scheduler }, { extra });
  } catch (e) {
    console.error(`gpt2: saving ${cfg.save} failed: ${reason(e)}`);
    run.gpu.destroy();
    Deno.exit(1);
  }
  run.emit("save", { path: cfg.save, step }, `saved ${cfg.save} (step ${step})`);
}

/** Mean loss (nats per token) over the held-out windows; one sync. */
async function validate(run: Run): Promise<number> {
  const { cfg, model, trainer } = run;
  const windows = evaluationWindows(run.data.validation, cfg.context, cfg.evalWindows);
  model.eval();
  const total = Tensor.zeros([]);
  for (let w = 0; w < windows.count; w += cfg.batch) {
    const n = Math.min(cfg.batch, windows.count - w),
      span = [w * cfg.context, (w + n) * cfg.context];
    noGrad(() =>
      tidy(() => {
        const ids = Tensor.from(windows.inputs.subarray(span[0], span[1]), [n, cfg.context], {
          dtype: "i32",
        });
        const loss = trainer.autocast(() =>
          model.loss(ids, windows.targets.subarray(span[0], span[1]))
        );
        addInPlace(total, loss, { alpha: n / windows.count });
      })
    );
  }
  const loss = await total.item(); // the sync point
  total.dispose();
  model.train();
  return loss;
}

/** Stops with exit status 3 when training diverged (before anything is saved over --save). */
function stopIfDiverged(run: Run, health: Health, step: number): void {
  if (health.warning) {
    run.emit("warning", { step, warning: health.warning }, `step ${step}: ${health.warning}`);
  }
  if (!health.diverged) return;
  const kept = run.cfg.save ? `; nothing was saved over ${run.cfg.save}` : "";
  console.error(`gpt2: training diverged at step ${step}: ${health.diverged}${kept}.`);
  run.gpu.destroy();
  Deno.exit(3);
}

/** --steps optimizer steps of --accum micro-batches each, from `start`. */
async function train(
  run: Run,
  start: number,
): Promise<{ loss: number; validation: number; secondsPerStep: number }> {
  const { cfg, gpu, model, trainer } = run;
  const rows = cfg.batch * cfg.context;
  const inputs = new Int32Array(rows), targets = new Int32Array(rows);
  const progress = new Progress(!cfg.json);
  const watch = await DivergenceWatch.start(trainer);
  let lossSum = Tensor.zeros([]), counted = 0, loss = NaN, validation = NaN;
  let clock = performance.now(), timed = 0, seconds = 0;
  gpu.resetPeakMemory();
  for (let step = start + 1; step <= cfg.steps; step++) {
    for (let micro = 0; micro < cfg.accum; micro++) {
      sampleBatch(run.data.train, cfg.context, run.batches, inputs, targets);
      const l = trainer.step(() =>
        model.loss(Tensor.from(inputs, [cfg.batch, cfg.context], { dtype: "i32" }), targets)
      );
      noGrad(() => addInPlace(lossSum, l));
      l.dispose();
      counted++;
    }
    run.scheduler.step();
    const logNow = step % cfg.logEvery === 0 || step === cfg.steps;
    const evalNow = step % cfg.evalEvery === 0 || step === cfg.steps;
    if (!logNow && !evalNow) continue;
    loss = (await lossSum.item()) / counted; // the sync point
    const now = performance.now();
    seconds += (now - clock) / 1000;
    timed += counted / cfg.accum;
    const perStep = seconds / timed;
    stopIfDiverged(run, await watch.check(loss, model.parameters()), step);
    const text = `loss ${loss.toFixed(4)}  ${perStep.toFixed(2)} s/step`;
    if (progress.isBar) progress.update(step, cfg.steps, text);
    else {
      const eta = progress.eta(step, cfg.steps);
      run.emit(
        "step",
        { step, loss, secondsPerStep: perStep },
        `step ${step}/${cfg.steps}  ${text}${eta ? `  ${eta}` : ""}`,
      );
    }
    lossSum.dispose();
    lossSum = Tensor.zeros([]);
    counted = 0;
    if (evalNow) {
      progress.finish();
      validation = await validate(run);
      run.emit(
        "eval",
        { step, validationLoss: validation },
        `step ${step}: validation loss ${validation.toFixed(4)}`,
      );
      stopIfDiverged(run, evaluationHealth(validation, trainer), step); // AMP's NaN too
      if (cfg.save) await save(run, step);
    }
    clock = performance.now(); // validation and saving are not training time
  }
  lossSum.dispose();
  progress.finish();
  return { loss, validation, secondsPerStep: seconds / Math.max(timed, 1) };
}

/**
 * The tokens of --prompt; a UsageError when it is empty, or when it and
 * --max-new-tokens need more positions than the model's `context`.
 */
function promptTokens(text: string, maxNewTokens: number, context: number): number[] {
  const prompt = encodeGpt2(text);
  if (prompt.length === 0) throw new UsageError("--prompt is empty.");
  if (prompt.length + maxNewTokens > context) {
    throw new UsageError(
      `--prompt is ${prompt.length} tokens; with --max-new-tokens ${maxNewTokens} that makes ` +
        `${prompt.length + maxNewTokens} positions, more than the model's ${context} positions: ` +
        "shorten the prompt or lower --max-new-tokens (--context sizes training windows only).",
    );
  }
  return prompt;
}

/** --prompt: samples --max-new-tokens tokens after `prompt` with the KV cache and prints them. */
async function sample(cfg: Gpt2Args, emit: Emit, model: TinyGpt, prompt: number[]): Promise<void> {
  const started = performance.now();
  const [ids] = await generate(model, [prompt], {
    maxNewTokens: cfg.maxNewTokens,
    temperature: cfg.temperature,
    topK: cfg.topK === 0 ? undefined : cfg.topK,
    seed: cfg.seed,
  });
  const seconds = (performance.now() - started) / 1000;
  const text = decodeGpt2(ids);
  emit(
    "sample",
    { prompt: cfg.prompt, promptIds: prompt, ids, text, secondsPerToken: seconds / ids.length },
    `${cfg.prompt}${text}\n(${ids.length} tokens, ${(seconds / ids.length).toFixed(3)} s/token)`,
  );
}

async function main(): Promise<void> {
  const started = performance.now();
  const cfg = await parseFlags(Deno.args);
  if (cfg === null) return;
  const emit: Emit = (event, fields, text) =>
    console.log(cfg.json ? JSON.stringify({ event, ...fields }) : text);
  // A --resume file that cannot continue here, or other flags, are refused before start-up.
  const record = await readRecordOrExit("gpt2", cfg.resume, GPT2_RUN);
  const changes = record
    ? orExit("gpt2", () => checkResumeFlags(cfg.resume!, record.flags, runFlags(cfg), cfg.override))
    : [];
  // The lock first: a run in use says so, not that its file holds a run.
  const lock = cfg.save
    ? await orExitAsync(
      "gpt2",
      () => SaveLock.acquire(cfg.save!, "save", (t) => console.error(`gpt2: ${t}`)),
    )
    : null;
  await orExitAsync("gpt2", () => checkSaveTarget(cfg, GPT2_RUN));
  const data = cfg.data
    ? await loadTextTokens(cfg.data, cfg).catch((e) =>
      orExit("gpt2", () => {
        throw e;
      })
    )
    : null;
  const weights = await readWeights(cfg);
  const sizes = weights.entries
    ? orExit("gpt2", () => {
      try {
        return gpt2SizesOf(weights.entries!, { json: weights.json, heads: weights.heads });
      } catch (e) {
        throw new UsageError(`--weights ${cfg.weights}: ${reason(e)}`);
      }
    })
    : RANDOM_SIZES[cfg.random!];
  if (data && cfg.context > sizes.context) {
    orExit("gpt2", () => {
      throw new UsageError(
        `--context ${cfg.context} is longer than the model's ${sizes.context} positions.`,
      );
    });
  }
  const prompt = cfg.prompt === undefined
    ? null
    : orExit("gpt2", () => promptTokens(cfg.prompt!, cfg.maxNewTokens, sizes.context));
  const gpu = await initGpu();
  // The sizes, checked against this adapter and host before any GPU allocation of the model.
  const sampleLength = (prompt?.length ?? 0) + cfg.maxNewTokens;
  const plan = gpt2Buffers(
    sizes,
    { ...cfg, training: data !== null, sampleLength },
    {
      fileBytes: weights.bytes,
      tokens: data ? data.train.length + data.validation.length : 0,
      cpuAdapter: gpu.adapterProfile.cpu,
      maxBufferBytes: runLimits(gpu).bufferBytes,
    },
  );
  const limits = runLimits(gpu);
  orExit("gpt2", () => checkPlan(plan, limits, GPT2_SIZES));
  const { model } = buildModel(cfg, weights, limits.bufferBytes);
  weights.entries?.clear(); // the host copy is no longer needed
  if (cfg.checkpoint) model.blocks.checkpoint = sizes.layers;
  emit(
    "start",
    {
      adapter: gpu.adapterName,
      model: sizes,
      parameters: gpt2Parameters(sizes),
      ...cfg,
      tokens: data ? data.train.length + data.validation.length : 0,
    },
    `adapter: ${gpu.adapterName}; GPT-2 ${sizes.layers} layers, width ${sizes.dim}, ${sizes.heads} heads, ` +
      `${(gpt2Parameters(sizes) / 1e6).toFixed(1)}M parameters (${
        cfg.weights ?? `random ${cfg.random}`
      })` +
      (data
        ? `\ntext: ${data.train.length} training and ${data.validation.length} held-out tokens; ` +
          `${precisionDetail(cfg.amp, cfg.ampDtype)}${
            cfg.checkpoint ? ", checkpointed blocks" : ""
          }; ` +
          `AdamW lr ${cfg.lr}, batch ${cfg.batch}×${cfg.accum} of ${cfg.context} tokens, ${cfg.steps} steps`
        : ""),
  );
  let result = null;
  if (data) {
    const optimizer = new AdamW(model.parameters(), { lr: cfg.lr, weightDecay: 0.01 });
    const trainer = new AmpTrainer(model, optimizer, {
      enabled: cfg.amp,
      dtype: cfg.ampDtype,
      accumulationSteps: cfg.accum,
      maxGradNorm: 1,
    });
    const scheduler = new LrScheduler(
      optimizer,
      cosineSchedule({
        warmupSteps: Math.min(cfg.warmup, cfg.steps - 1),
        totalSteps: cfg.steps,
        minFactor: 0.1,
      }),
    );
    const run: Run = {
      cfg,
      emit,
      gpu,
      data,
      model,
      optimizer,
      trainer,
      scheduler,
      batches: new RandomGenerator(cfg.seed + 1),
    };
    const start = await resumeOrStart(run, record, changes);
    const before = start < cfg.steps ? await validate(run) : NaN;
    if (start < cfg.steps) {
      emit(
        "eval",
        { step: start, validationLoss: before },
        `validation loss before training: ${before.toFixed(4)}`,
      );
    }
    result = {
      ...(start < cfg.steps
        ? await train(run, start)
        : { loss: NaN, validation: NaN, secondsPerStep: NaN }),
      before,
    };
    result = { ...result, peakBytes: gpu.memoryStats().peakBytes };
    if (cfg.saveWeights) {
      await saveGpt2(cfg.saveWeights, model).catch((e) => {
        console.error(`gpt2: writing ${cfg.saveWeights} failed: ${reason(e)}`);
        Deno.exit(1);
      });
      emit(
        "saved",
        { path: cfg.saveWeights },
        `saved ${cfg.saveWeights} (Hugging Face's GPT-2 layout)`,
      );
    }
    trainer.dispose();
    optimizer.dispose();
  }
  if (prompt) await sample(cfg, emit, model, prompt);
  const wallSeconds = (performance.now() - started) / 1000;
  emit(
    "final",
    { ...result, wallSeconds },
    result
      ? `validation loss ${result.before.toFixed(4)} → ${result.validation.toFixed(4)}; ` +
        `${result.secondsPerStep.toFixed(2)} s/step; peak GPU memory ${
          (result.peakBytes / 2 ** 30).toFixed(2)
        } GiB; wall ${wallSeconds.toFixed(1)} s`
      : `wall ${wallSeconds.toFixed(1)} s`,
  );
  model.dispose();
  gpu.destroy();
  lock?.release();
}

if (import.meta.main) await runMain("gpt2", main);
