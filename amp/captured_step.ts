/**
 * A training step captured once and replayed every step after (CUDA Graphs'
 * `torch.cuda.graph`, ONNX Runtime WebGPU's `enableGraphCapture`): the
 * trainer's whole micro-batch — forward, backward, and after the last
 * micro-batch of an effective batch unscale, clipping, the optimizer and the
 * scale update — recorded as it runs eagerly, then replayed with no
 * autograd, no tensors and no pool traffic in JavaScript: one pass of
 * pipelines, bind groups, dynamic offsets and grids, the batch copied into
 * the step's own input buffers first.
 *
 * What changes from step to step lives on the GPU (the loss scale, the
 * found-inf flag, Adam's step count and with it the bias corrections) or in
 * the few uniform words a replay recomputes and writes with one
 * `writeBuffer` (a scheduled learning rate, the dropout ranges drawn anew
 * from their generators, the scaler's settings). With accumulation over N
 * micro-batches, each position of the cycle is a graph of its own.
 *
 * Never silently wrong. A step is recorded in two whole cycles that must
 * agree command for command (a step that branches on host state does not;
 * a first run that makes lazily created state is allowed a third), then
 * replayed bit for bit. Before each replay it checks what would make the
 * replay differ, and records again at the next cycle boundary (or runs the
 * micro-batch eagerly inside a cycle) with a one-line reason: another input
 * shape or dtype, a module's setting (training mode, checkpointing, a
 * dropout probability), a parameter registered or frozen, the tuner picking
 * other kernels, a tensor the step uses freed, the batch's ids deciding
 * another path, gradients not where the recording left them. It refuses in
 * one line what it cannot replay: a read inside the step, a step that does
 * different work every time, a trainer with a numerics inspector, a lost
 * device.
 *
 * The buffers the step's recordings took stay reserved for it (a
 * `PoolReserve`): the same ones the eager step would take from the pool, so
 * the peak does not grow; they go back when it is disposed or recaptured.
 */
import {
  ArrayStorage,
  assertDType,
  assertValidShape,
  bufferBytes,
  CommandGraph,
  type DType,
  fail,
  firstDifference,
  type Gpu,
  type PoolReserve,
  recheckStep,
  recordStep,
  redrawStep,
  sameShape,
  settingsEpoch,
  type Shape,
  ShapeError,
  shapeString,
  shortValue,
  sizeOf,
  StateError,
  StepRecording,
  Tensor,
  type TensorData,
  untracked,
  ValueError,
} from "../gpu/mod.ts";
import type { Optimizer } from "../optim/optimizer.ts";
import type { HasParameters } from "./has_parameters.ts";
import { type HostFields, hostFields } from "./host_fields.ts";

/** Options of `AmpTrainer.capture`. */
export interface CaptureOptions {
  /**
   * Told, in one line, why a captured step records again (another input
   * shape, a module set to eval mode, ...). Default: `console.warn`, once
   * per reason.
   */
  onRecapture?: (reason: string) => void;
}

/** What a {@link CapturedStep} has done so far. */
export interface CaptureStats {
  /** Micro-batches replayed. */
  replayed: number;
  /** Micro-batches run eagerly while being recorded. */
  recorded: number;
  /** Micro-batches run eagerly without recording (inside a cycle the recording does not fit). */
  eager: number;
  /** How many times the step was captured (recorded and verified). */
  captures: number;
  /** Why it was last recorded again, or null. */
  lastRecapture: string | null;
  /** Dispatches a replayed effective batch runs (all its micro-batches), 0 before the first capture. */
  dispatches: number;
  /** Bytes the capture keeps for itself: its reserve of pool buffers and its graphs. */
  reservedBytes: number;
}

/**
 * A batch given as host data (a typed array, numbers): written straight
 * into the step's own input buffer, converted to `dtype` (default f32) as
 * `Tensor.from` converts it; no tensor of its own is made.
 */
export interface HostInput {
  /** The values, `shape`'s size of them. */
  readonly data: TensorData;
  /** Its shape. */
  readonly shape: Shape;
  /** Its dtype (default f32; i32 for ids and class targets). */
  readonly dtype?: DType;
}

/** One input of {@link CapturedStep.run}: a tensor (copied on the GPU) or host data. */
export type StepInput = Tensor | HostInput;

/** An input as `run` sees it. */
interface Given {
  readonly shape: Shape;
  readonly dtype: DType;
  readonly tensor: Tensor | null;
  readonly data: TensorData | null;
}

/** What a trainer lends its captured steps. @internal */
export interface TrainerAccess {
  readonly gpu: Gpu;
  readonly model: HasParameters;
  readonly optimizer: Optimizer;
  readonly accumulationSteps: number;
  /** Micro-batches since the last optimizer step. */
  microStep(): number;
  /** One eager micro-batch: what `trainer.step` does. */
  step(computeLoss: () => Tensor): Tensor;
  /** The counters a replayed micro-batch moves (no work). */
  advance(): void;
  /** The step was disposed. */
  forget(step: CapturedStep): void;
}

/** A gradient a recording left in a buffer: where it is and what it is. */
interface GradSlot {
  readonly buffer: GPUBuffer;
  readonly shape: Shape;
  readonly dtype: DType;
}

/** One recorded micro-batch (a position of the accumulation cycle). */
interface Position {
  readonly recording: StepRecording;
  /** The buffer the loss was in at the end, its shape and dtype. */
  readonly loss: GradSlot;
  /** Each parameter's gradient buffer when it started (null: none). */
  readonly gradsBefore: readonly (GPUBuffer | null)[];
  /** Each parameter's gradient when it ended (null: none). */
  readonly gradsAfter: readonly (GradSlot | null)[];
}

/** A verified cycle, replayable. */
interface Capture {
  readonly positions: readonly Position[];
  readonly graphs: readonly CommandGraph[];
  readonly pinned: readonly GPUBuffer[];
}

/** Cycles recorded at most before a step whose recordings keep differing is refused. */
const MAX_RECORDED_CYCLES = 3;

/**
 * A training step captured by `AmpTrainer.capture`: `run(...inputs)` does
 * what `trainer.step(() => computeLoss(...inputs))` does, replayed once the
 * step is captured. See the module comment.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { AdamW, AmpTrainer, crossEntropy, initGpu, Linear, Tensor } from "../mod.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const model = new Linear(4, 3, { seed: 1 });
 * const trainer = new AmpTrainer(model, new AdamW(model.parameters()));
 * const step = trainer.capture((x, y) => crossEntropy(model.forward(x), y));
 * const x = Tensor.from([1, 2, 3, 4, 4, 3, 2, 1], [2, 4]);
 * const y = Tensor.from([0, 2], [2], { dtype: "i32" });
 * // Recorded in its first two or three runs (a first step makes some state), then replayed.
 * for (let i = 0; i < 6; i++) step.run(x, y).dispose();
 * assert.ok(step.captured);
 * assert.equal(step.stats.recorded + step.stats.replayed, 6);
 * assert.equal(trainer.steps, 6);
 * trainer.dispose();
 * gpu.destroy();
 * ```
 */
export class CapturedStep {
  #t: TrainerAccess;
  #fn: (...inputs: Tensor[]) => Tensor;
  #onRecapture: (reason: string) => void;
  #params: readonly Tensor[];
  #reserve: PoolReserve | null = null;
  #inputs: Tensor[] | null = null;
  #capture: Capture | null = null;
  /** The cycle being recorded, and the last one recorded whole. */
  #recording: Position[] = [];
  #previous: Position[] | null = null;
  #cyclesRecorded = 0;
  /** The tuning epoch and host fields the recordings were made under. */
  #epoch = -1;
  #fields: HostFields | null = null;
  /** Why the capture no longer fits (a tensor it uses was freed), or null. */
  #stale: string | null = null;
  #stats: Omit<CaptureStats, "dispatches" | "reservedBytes"> = {
    replayed: 0,
    recorded: 0,
    eager: 0,
    captures: 0,
    lastRecapture: null,
  };
  #disposed = false;
  #onPinReleased = () => {
    this.#stale ??= "a tensor the captured step uses was freed";
  };

  /** Use `AmpTrainer.capture`. @internal */
  constructor(
    trainer: TrainerAccess,
    computeLoss: (...inputs: Tensor[]) => Tensor,
    options: CaptureOptions = {},
  ) {
    if (typeof computeLoss !== "function") {
      fail(ValueError, "AmpTrainer.capture", "pass the loss as a function of the step's inputs.");
    }
    this.#t = trainer;
    this.#fn = computeLoss;
    const told = new Set<string>(); // by default each reason is said once
    this.#onRecapture = options.onRecapture ?? ((reason) => {
      if (told.has(reason)) return;
      told.add(reason);
      console.warn(`halfstep: capturing the training step again: ${reason}.`);
    });
    this.#params = trainer.model.parameters();
  }

  /** What the step has done so far (no sync). */
  get stats(): CaptureStats {
    const graphs = this.#capture?.graphs ?? [];
    return {
      ...this.#stats,
      dispatches: graphs.reduce((n, g) => n + g.dispatches, 0),
      reservedBytes: (this.#reserve?.bytes ?? 0) + graphs.reduce((n, g) => n + g.bytes, 0),
    };
  }

  /** True once the step is captured and replays. */
  get captured(): boolean {
    return this.#capture !== null;
  }

  /**
   * One micro-batch on `inputs` (tensors, or host data written straight into
   * the step's input buffers, of the shapes and dtypes the step was captured
   * with; others capture it again): what
   * `trainer.step(() => computeLoss(...inputs))` does, replayed once
   * captured. Returns the unscaled loss, a tensor of its own; dispose it
   * (reading it is a sync point). No sync.
   */
  run(...batch: StepInput[]): Tensor {
    this.#live();
    const t = this.#t, gpu = t.gpu;
    gpu.throwIfFailed();
    const inputs = batch.map((x, i) => this.#given(x, i));
    const micro = t.microStep();
    let why = this.#staleReason(inputs);
    if (why !== null && micro === 0) this.#drop(why);
    if (why === null && this.#capture) {
      const position = this.#capture.positions[micro];
      this.#setRanges(inputs);
      why = recheckStep(position.recording); // throws as the op would (an id out of range)
      if (why === null) {
        if (this.#gradsAsBefore(position)) return this.#replay(position, micro, inputs);
        why = "the gradients are not where the recording left them";
      } else if (micro === 0) this.#drop(why);
    }
    if (micro !== this.#recording.length || (why !== null && micro !== 0)) {
      // Inside a cycle the recordings do not fit: eagerly, until the next boundary.
      this.#recording = [];
      this.#stats.eager++;
      const tensors = inputs.map((x) =>
        x.tensor ?? untracked(() => Tensor.from(x.data!, x.shape, { dtype: x.dtype, gpu }))
      );
      try {
        return t.step(() => this.#fn(...tensors));
      } finally {
        tensors.forEach((x, i) => inputs[i].tensor || x.dispose());
      }
    }
    return this.#record(inputs);
  }

  /**
   * Drops the capture: the next micro-batch at a cycle boundary records
   * again (after changing a tuner's settings by hand, say). No sync.
   */
  invalidate(reason = "invalidate() was called"): void {
    this.#live();
    this.#stale ??= reason;
  }

  /** Frees the graphs, the step's input buffers and its reserve of pool buffers. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#drop(null);
    this.#inputs?.forEach((t) => t.dispose());
    this.#inputs = null;
    this.#disposed = true;
    this.#t.forget(this);
  }

  /** Records micro-batch `inputs` as it runs eagerly (a position of the cycle being recorded). */
  #record(inputs: readonly Given[]): Tensor {
    const t = this.#t, gpu = t.gpu;
    if (this.#recording.length === 0) {
      this.#epoch = settingsEpoch(gpu);
      this.#fields = hostFields(t.model, this.#params);
    }
    const statics = this.#staticInputs(inputs);
    this.#setRanges(inputs); // host data written here
    for (let i = 0; i < inputs.length; i++) {
      const x = inputs[i].tensor;
      if (x && x !== statics[i]) statics[i].copyFrom(x);
    }
    this.#reserve ??= gpu.pool.openReserve();
    const gradsBefore = this.#params.map((p) => p.grad?.buffer ?? null);
    const recording = new StepRecording();
    let loss: Tensor;
    try {
      loss = recordStep(gpu, this.#reserve, recording, () => t.step(() => this.#loss(statics)));
    } catch (e) {
      this.#recording = [];
      throw e;
    }
    this.#stats.recorded++;
    const refusal = recording.commands.refusal;
    if (refusal) {
      loss.dispose();
      this.#recording = [];
      fail(
        StateError,
        "AmpTrainer.capture",
        `the step cannot be captured: ${refusal}; read after run() returns, or train ` +
          "uncaptured (trainer.step)",
      );
    }
    const out = Tensor.empty(loss.shape, loss.dtype, gpu); // the caller's, as an op's result
    gpu.batch.copy(loss.buffer, out.buffer, bufferBytes(loss.size, loss.dtype));
    this.#recording.push({
      recording,
      loss: { buffer: loss.buffer, shape: loss.shape, dtype: loss.dtype },
      gradsBefore,
      gradsAfter: this.#params.map((p) =>
        p.grad ? { buffer: p.grad.buffer, shape: p.grad.shape, dtype: p.grad.dtype } : null
      ),
    });
    loss.dispose();
    if (this.#recording.length === t.accumulationSteps) this.#cycleRecorded();
    return out;
  }

  /** The loss of the step on its own input tensors, checked to be a tensor made synchronously. */
  #loss(statics: Tensor[]): Tensor {
    const loss = this.#fn(...statics) as unknown;
    if (!(loss instanceof Tensor)) {
      fail(
        ValueError,
        "AmpTrainer.capture",
        `the step must return the loss tensor synchronously, got ${
          loss instanceof Promise ? "a promise (an async function)" : typeof loss
        }.`,
      );
    }
    return loss;
  }

  /** A whole cycle was recorded: replayable once two in a row agree. */
  #cycleRecorded(): void {
    const cycle = this.#recording, previous = this.#previous;
    this.#recording = [];
    this.#cyclesRecorded++;
    const difference = previous ? cycleDifference(previous, cycle) : "first recording";
    if (difference === null) return this.#finalize(cycle);
    this.#previous = cycle;
    if (this.#cyclesRecorded >= MAX_RECORDED_CYCLES) {
      this.#previous = null;
      this.#cyclesRecorded = 0;
      fail(
        StateError,
        "AmpTrainer.capture",
        `the step does different work every time it runs (${difference}): it branches on ` +
          "host state or uploads data from JavaScript; pass what changes as an input tensor, " +
          "or train uncaptured (trainer.step)",
      );
    }
  }

  /** Makes the graphs of a verified cycle and pins the long-lived tensors it uses. */
  #finalize(cycle: Position[]): void {
    const gpu = this.#t.gpu, pool = gpu.pool, reserve = this.#reserve!;
    const align = gpu.device.limits.minUniformBufferOffsetAlignment;
    const graphs = cycle.map((p) =>
      new CommandGraph(gpu.device, p.recording.commands.commands, {
        align,
        label: "halfstep captured step",
      })
    );
    const own = new Set(this.#inputs!.map((t) => t.buffer));
    const pinned: GPUBuffer[] = [];
    for (const b of new Set(cycle.flatMap((p) => [...p.recording.commands.buffers()]))) {
      if (own.has(b) || reserve.owns(b) && !pool.inUse(b)) continue;
      if (!pool.inUse(b)) pool.adoptInto(reserve, b); // freed inside the step: the step's own now
      else {
        pool.pin(b, this.#onPinReleased);
        pinned.push(b);
      }
    }
    this.#capture = { positions: cycle, graphs, pinned };
    this.#previous = null;
    this.#cyclesRecorded = 0;
    this.#stats.captures++;
  }

  /** Replays `position` on `inputs` (host checks passed). */
  #replay(position: Position, micro: number, inputs: readonly Given[]): Tensor {
    const t = this.#t, gpu = t.gpu, batch = gpu.batch;
    const statics = this.#inputs!;
    redrawStep(position.recording);
    const { loss } = position;
    const out = Tensor.empty(loss.shape, loss.dtype, gpu);
    batch.replay(this.#capture!.graphs[micro], () => {
      for (let i = 0; i < inputs.length; i++) {
        const x = inputs[i].tensor; // host data was written already
        if (x && x !== statics[i]) {
          batch.copy(x.buffer, statics[i].buffer, bufferBytes(x.size, x.dtype));
        }
      }
    });
    batch.copy(loss.buffer, out.buffer, bufferBytes(out.size, out.dtype));
    batch.flushIfDue(); // by default at once: the GPU starts now
    this.#leaveGrads(position);
    t.advance();
    this.#stats.replayed++;
    return out;
  }

  /** Sets each parameter's `.grad` as the recording left it (handles on the step's buffers). */
  #leaveGrads(position: Position): void {
    const gpu = this.#t.gpu;
    this.#params.forEach((p, i) => {
      const want = position.gradsAfter[i];
      if (want === null) {
        p.grad?.dispose();
        p.grad = null;
        return;
      }
      if (p.grad && !p.grad.disposed && p.grad.buffer === want.buffer) return;
      p.grad?.dispose();
      gpu.pool.claim(this.#reserve!, want.buffer);
      p.grad = untracked(() =>
        new Tensor(gpu, want.shape, want.dtype, new ArrayStorage(gpu, want.buffer))
      );
    });
  }

  /** Whether every parameter's gradient is where the recording of `position` found it. */
  #gradsAsBefore(position: Position): boolean {
    return this.#params.every((p, i) =>
      (p.grad && !p.grad.disposed ? p.grad.buffer : null) === position.gradsBefore[i]
    );
  }

  /** Why the capture (or the cycle being recorded) no longer fits, or null. */
  #staleReason(inputs: readonly Given[]): string | null {
    if (!this.#capture && this.#recording.length === 0 && !this.#previous) return null;
    if (this.#stale) return this.#stale;
    const statics = this.#inputs;
    if (statics) {
      if (statics.length !== inputs.length) {
        return `the step took ${statics.length} inputs, now ${inputs.length}`;
      }
      for (let i = 0; i < inputs.length; i++) {
        const x = inputs[i], s = statics[i];
        if (x.dtype !== s.dtype || !sameShape(x.shape, s.shape)) {
          const now = `${x.dtype} ${shapeString(x.shape)}`;
          return `input ${i} is ${now}, the step was captured with ${s.describe()}`;
        }
      }
    }
    if (settingsEpoch(this.#t.gpu) !== this.#epoch) return "the tuner picked other kernels";
    return this.#fields?.changed() ?? null;
  }

  /** Forgets the capture and every recording (`why`: tell it, a capture was replaced). */
  #drop(why: string | null): void {
    const capture = this.#capture;
    if (capture) {
      // A replay may still be in the open batch: submitted before its buffers go.
      this.#t.gpu.batch.flush();
      for (const g of capture.graphs) g.destroy();
      for (const b of capture.pinned) this.#t.gpu.pool.unpin(b, this.#onPinReleased);
    }
    this.#capture = null;
    this.#recording = [];
    this.#previous = null;
    this.#cyclesRecorded = 0;
    this.#stale = null;
    if (this.#reserve) this.#t.gpu.pool.closeReserve(this.#reserve);
    this.#reserve = null;
    if (why !== null && capture) {
      this.#stats.lastRecapture = why;
      this.#onRecapture(why);
    }
  }

  /** The step's own input tensors, made (again) for `inputs`' shapes and dtypes. */
  #staticInputs(inputs: readonly Given[]): Tensor[] {
    const have = this.#inputs;
    const fits = have && have.length === inputs.length &&
      have.every((s, i) => s.dtype === inputs[i].dtype && sameShape(s.shape, inputs[i].shape));
    if (fits) return have;
    have?.forEach((s) => s.dispose());
    const gpu = this.#t.gpu;
    return this.#inputs = untracked(() =>
      inputs.map((x) => Tensor.empty([...x.shape], x.dtype, gpu))
    );
  }

  /**
   * Gives the step's inputs what ops check on the host, the id ranges of
   * `inputs`; host data is written into them here (which gives its range).
   */
  #setRanges(inputs: readonly Given[]): void {
    const statics = this.#inputs;
    if (!statics) return;
    for (let i = 0; i < inputs.length; i++) {
      const { tensor, data } = inputs[i];
      if (data) statics[i].write(data);
      else if (tensor!.dtype === "i32") statics[i].setIndexRange(tensor!.indexRange);
    }
  }

  /** Input `i` of a run, checked. */
  #given(x: StepInput, i: number): Given {
    const where = "CapturedStep.run";
    if (x instanceof Tensor) {
      if (x.disposed || x.gpu !== this.#t.gpu) {
        const what = x.disposed ? "disposed" : "on another device";
        fail(ValueError, where, `input ${i} (${x.describe()}) is ${what}.`);
      }
      return { shape: x.shape, dtype: x.dtype, tensor: x, data: null };
    }
    const host = x as Partial<HostInput> | null;
    if (typeof host?.data?.length !== "number" || !Array.isArray(host.shape)) {
      fail(
        ValueError,
        where,
        `input ${i} must be a tensor or { data, shape, dtype? } of host numbers, got ${
          shortValue(x)
        }.`,
      );
    }
    assertValidShape(where, host.shape!);
    const dtype = host.dtype ?? "f32";
    assertDType(where, dtype);
    if (host.data!.length !== sizeOf(host.shape!)) {
      fail(
        ShapeError,
        where,
        `input ${i} has ${host.data!.length} values for shape ${shapeString(host.shape!)}.`,
      );
    }
    return { shape: host.shape!, dtype, tensor: null, data: host.data! };
  }

  #live(): void {
    if (this.#disposed) fail(StateError, "CapturedStep", "this captured step was disposed.");
  }
}

/** Where two recorded cycles of a step first differ, in words, or null. */
function cycleDifference(a: readonly Position[], b: readonly Position[]): string | null {
  for (let i = 0; i < a.length; i++) {
    const x = a[i], y = b[i];
    const at = a.length > 1 ? `micro-batch ${i}, ` : "";
    const commands = firstDifference(x.recording.commands.commands, y.recording.commands.commands);
    if (commands) return at + commands;
    if (x.recording.draws.length !== y.recording.draws.length) return `${at}other random draws`;
    if (x.recording.checks.length !== y.recording.checks.length) return `${at}other host checks`;
    if (x.loss.buffer !== y.loss.buffer) return `${at}the loss in another buffer`;
    const grads = (g: Position) => g.gradsAfter.map((s) => s?.buffer ?? null);
    if (!sameList(grads(x), grads(y)) || !sameList(x.gradsBefore, y.gradsBefore)) {
      return `${at}gradients in other buffers`;
    }
  }
  return null;
}

function sameList<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}
