/**
 * Builds every pipeline the library could build on an adapter, through the
 * library's own code paths: a device of Dawn's null backend presenting as the
 * adapter (`initGpu({ backend: "dawn-null", adapter })`, so the adapter
 * profile, the candidates, the plans and workgroup sizes are the ones that
 * GPU gets), then
 *
 * - training steps of an MLP, a CNN and a small GPT (every layer, loss and
 *   optimizer; f32, f16 AMP and bf16 AMP; accumulation, clipping,
 *   checkpointing, dropout, the numerics inspector) under every matmul tiling
 *   the tuners could pick for each dtype (the products and the convolutions'
 *   GEMMs as those layers make them: orientations, epilogues, output dtypes,
 *   split-K);
 * - the fused attention's forward and backward under every plan the tuner
 *   could pick (forced, as the tuner times them), per dtype and head size,
 *   with and without dropout and packed q/k/v;
 * - the ops no layer reaches (softmaxes, reductions, element maps, moves).
 *
 * Nothing executes there. The report lists each pipeline's outcome: compiled
 * by Tint and accepted by Dawn; refused; or refused only for the null device's
 * own limits (WebGPU's defaults: 16 KiB of workgroup memory, 256 invocations,
 * 8 storage buffers a stage) while within the adapter's, judged from the figure
 * Dawn names (see gpu/device/described_adapter.ts). And which kernel families
 * were built in which dtypes, against every family the library defines.
 */
import {
  Adam,
  AdamW,
  AdaptiveAvgPool2d,
  add,
  AmpTrainer,
  type AmpTrainerOptions,
  AvgPool2d,
  BatchNorm2d,
  cast,
  causalSoftmax,
  clipGradNorm,
  concat,
  Conv2d,
  crossEntropy,
  div,
  Dropout,
  type DType,
  Embedding,
  embedding,
  exp,
  Flatten,
  type FloatDType,
  GELU,
  initGpu,
  LayerNorm,
  layerNorm,
  Linear,
  linearCrossEntropy,
  log,
  logSoftmax,
  max,
  MaxPool2d,
  maxPool2d,
  mean,
  Module,
  mseLoss,
  mul,
  narrow,
  noGrad,
  NumericsInspector,
  permute,
  ReLU,
  reshape,
  Sequential,
  SGD,
  softmax,
  split,
  sqrt,
  square,
  sub,
  sum,
  Tensor,
  tidy,
  TransformerBlock,
} from "../../mod.ts";
import { DEFAULT_TILING, type MatmulTiling } from "../../gpu/kernels/gemm/settings.ts";
import { matmulSettings } from "../../gpu/kernels/gemm/settings.ts";
import { matmulCandidates } from "../../gpu/kernels/gemm/candidates.ts";
import { tilingName } from "../../gpu/kernels/gemm/tilings.ts";
import {
  attentionPlanCandidates,
  DEFAULT_ATTENTION_PLAN,
} from "../../gpu/kernels/attention/plans.ts";
import {
  launchFlashAttention,
  launchFlashAttentionBackward,
} from "../../gpu/kernels/attention/flash_attention.ts";
import { definedKernels } from "../../gpu/device/kernel.ts";
import { describedLimits } from "../../gpu/device/described_adapter.ts";
import {
  type AdapterDescription,
  type AttentionPlan,
  DeviceArray,
  type Gpu,
  RandomGenerator,
} from "../../gpu/mod.ts";
import { uniform } from "./reference.ts";
import { launchUnscaleInto } from "../../amp/kernels/grad_scaler.ts";
import { subgroupMatrixCandidates } from "../../gpu/kernels/gemm/candidates.ts";
import { attentionMatrixFor } from "../../gpu/kernels/attention/flash_attention_subgroup_matrix.ts";
import { matrixBackwardsFor } from "../../gpu/kernels/attention/flash_attention_subgroup_matrix_backward.ts";

/** One pipeline's outcome. */
export interface PipelineOutcome {
  /** Its cache key: the family and its config. */
  key: string;
  /** `"ok"`; `"beyond-null"`: refused only for a null-device limit the adapter has (see module comment); `"failed"`. */
  outcome: "ok" | "beyond-null" | "failed";
  /** Dawn's message, where it was refused. */
  message?: string;
}

/** What {@link compileEveryPipeline} built. */
export interface CompileReport {
  adapter: string;
  pipelines: PipelineOutcome[];
  /** Kernel families built, each with the dtypes (`dtype` config field) it was built in. */
  families: Map<string, Set<string>>;
  /** Families the library defines that no pipeline was built of. */
  unbuilt: string[];
  /** Tilings and plans the run went through, for the report. */
  tilings: number;
  plans: number;
}

/** The float dtypes a device has: f16 and bf16 need shader-f16 (bf16 is stored as u32 halves, computed in f32). */
function dtypesOf(gpu: Gpu): FloatDType[] {
  return gpu.f16 ? ["f32", "f16", "bf16"] : ["f32", "bf16"];
}

/**
 * Every tiling dispatch may use for products stored in `dtype`: the default,
 * the tuners' candidates, and the subgroup-matrix ones `matmulTiling:
 * "subgroup-matrix"` forces (CPU adapters never tune them).
 */
export function tilingsFor(gpu: Gpu, dtype: FloatDType): MatmulTiling[] {
  const seen = new Set<string>();
  const forced = subgroupMatrixCandidates(gpu, dtype);
  return [DEFAULT_TILING, ...matmulCandidates(gpu, dtype), ...forced].filter((t) => {
    const name = tilingName(t);
    return !seen.has(name) && seen.add(name);
  });
}

/** Runs `fn` with `tiling` forced for every matmul class (as `matmulTiling: tiling` does). */
async function withTiling(gpu: Gpu, tiling: MatmulTiling, fn: () => Promise<void>): Promise<void> {
  const settings = matmulSettings.of(gpu);
  const { tiling: before } = settings;
  const winners = [...settings.classTilings];
  settings.classTilings.clear();
  settings.tiling = tiling;
  try {
    await fn();
  } finally {
    settings.tiling = before;
    for (const [key, t] of winners) settings.classTilings.set(key, t);
  }
}

const range = (n: number, seed: number) => uniform(n, seed, -1, 1);

/** The precisions of a training step: f32, and AMP in each half dtype the device has. */
function precisions(gpu: Gpu): AmpTrainerOptions[] {
  return [
    { enabled: false },
    ...(gpu.f16 ? [{ dtype: "f16" as const, maxGradNorm: 1 }] : []),
    { dtype: "bf16" as const, accumulationSteps: 2 },
  ];
}

/** The optimizers every precision trains with: AdamW's f32 and compact states, Adam, SGD. */
type Optimizer = "adamw" | "adamw 8bit" | "adamw bf16" | "adam" | "sgd";

/** A few steps of `model` under `options`: forward, backward, unscale, clipping, update. */
function train(
  model: Module,
  loss: () => Tensor,
  options: AmpTrainerOptions,
  optimizer: Optimizer = "adamw",
): void {
  const params = model.parameters();
  const opt = optimizer === "sgd"
    ? new SGD(params, { lr: 0.01, momentum: 0.9 })
    : optimizer === "adam"
    ? new Adam(params, { lr: 1e-3 })
    : optimizer === "adamw 8bit"
    // Every tensor in 8 bits, the smallest too: each block size the kernel meets.
    ? new AdamW(params, { lr: 1e-3, stateDtype: "8bit", min8bitSize: 0 })
    : optimizer === "adamw bf16"
    ? new AdamW(params, { lr: 1e-3, stateDtype: "bf16" })
    : new AdamW(params, { lr: 1e-3, weightDecay: 0.01 });
  const trainer = new AmpTrainer(model, opt, options);
  for (let i = 0; i < (options.accumulationSteps ?? 1); i++) trainer.step(loss).dispose();
  trainer.dispose();
  opt.dispose();
}

/** An MLP of every dense layer: Linear (with and without bias, fused ReLU/GELU), Dropout, LayerNorm. */
function mlpStep(gpu: Gpu, options: AmpTrainerOptions, optimizer: Optimizer) {
  const model = new Sequential(
    new Linear(20, 48, { seed: 1, gpu }),
    new ReLU(),
    new Linear(48, 96, { seed: 2, gpu, bias: false }),
    new GELU(),
    new Dropout(0.1, { seed: 3 }),
    new LayerNorm(96, { gpu }),
    new Linear(96, 10, { seed: 4, gpu }),
  );
  // 300 rows: the column reductions of bias and LayerNorm gradients that GPUs take past 64 rows.
  const x = Tensor.from(range(300 * 20, 5), [300, 20], { gpu });
  const labels = Array.from({ length: 300 }, (_, i) => i % 10);
  train(model, () => crossEntropy(model.forward(x), labels), options, optimizer);
  x.dispose();
  model.dispose();
}

/** A CNN: Conv2d (grouped, strided), BatchNorm2d, the pools, Flatten, Linear. */
function cnnStep(gpu: Gpu, options: AmpTrainerOptions) {
  const model = new Sequential(
    new Conv2d(3, 8, 3, { padding: 1, seed: 1, gpu }),
    new BatchNorm2d(8, { gpu }),
    new ReLU(),
    new MaxPool2d(2),
    new Conv2d(8, 8, 3, { padding: 1, stride: 2, groups: 2, seed: 2, gpu, bias: false }),
    new AvgPool2d(2),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear(8, 10, { seed: 3, gpu }),
  );
  const x = Tensor.from(range(4 * 3 * 12 * 12, 6), [4, 3, 12, 12], { gpu });
  const labels = [1, 2, 3, 4];
  train(model, () => crossEntropy(model.forward(x), labels), options);
  x.dispose();
  model.dispose();
}

/** A small GPT: embeddings, a checkpointed TransformerBlock with attention dropout, the tied head. */
class SmallGpt extends Module {
  readonly tokens: Embedding;
  readonly positions: Embedding;
  readonly blocks: Sequential;
  readonly norm: LayerNorm;
  constructor(gpu: Gpu, dim: number) {
    super();
    this.tokens = this.registerModule("tokens", new Embedding(37, dim, { seed: 1, gpu }));
    this.positions = this.registerModule("positions", new Embedding(16, dim, { seed: 2, gpu }));
    this.blocks = this.registerModule(
      "blocks",
      new Sequential(
        new TransformerBlock(dim, 2, { seed: 3, gpu, attention: { dropout: 0.1 } }),
        new TransformerBlock(dim, 2, { seed: 4, gpu }),
      ),
    );
    this.norm = this.registerModule("norm", new LayerNorm(dim, { gpu }));
  }
  forward(): Tensor {
    throw new Error("SmallGpt: use loss()");
  }
  loss(ids: Tensor, positions: Tensor, targets: number[]): Tensor {
    const x = tidy(() => {
      const t = this.tokens.forward(ids), p = this.positions.forward(positions);
      return reshape(add(t, p), [ids.shape[0] * ids.shape[1], t.shape[2]]);
    });
    const [b, t] = ids.shape;
    const h = this.blocks.forward(reshape(x, [b, t, x.shape[1]]));
    const rows = this.norm.forward(reshape(h, [b * t, h.shape[2]]));
    return linearCrossEntropy(rows, this.tokens.weight, targets);
  }
}

function gptStep(gpu: Gpu, options: AmpTrainerOptions, dim: number) {
  const model = new SmallGpt(gpu, dim);
  model.blocks.checkpoint = "auto";
  const t = 13, b = 2;
  const ids = Tensor.from(Array.from({ length: b * t }, (_, i) => (i * 7) % 37), [b, t], {
    dtype: "i32",
    gpu,
  });
  const positions = Tensor.from(Array.from({ length: b * t }, (_, i) => i % t), [b, t], {
    dtype: "i32",
    gpu,
  });
  const targets = Array.from({ length: b * t }, (_, i) => (i * 5) % 37);
  const inspector = new NumericsInspector(model);
  train(model, () => model.loss(ids, positions, targets), { ...options, inspector });
  inspector.dispose();
  for (const x of [ids, positions]) x.dispose();
  model.dispose();
}

/** The ops no layer above reaches, forward and backward, in `dtype`. */
function opsStep(gpu: Gpu, dtype: FloatDType) {
  tidy(() => {
    // A leaf of `dtype` (a model kept in that dtype): its gradient is of that dtype too.
    const leaf = Tensor.from(range(6 * 70, 7), [6, 70], { gpu, dtype, requiresGrad: true });
    const x = mul(leaf, Tensor.full([6, 70], 1, { gpu, dtype }));
    const y = Tensor.from(range(6 * 70, 8), [6, 70], { gpu, dtype });
    const parts = [
      sum(softmax(x)),
      sum(logSoftmax(x)),
      sum(causalSoftmax(reshape(narrow(x, 1, 0, 36), [6, 6, 6]))),
      mul(mean(x), noGrad(() => sum(max(y, { axis: 0 })))),
      sum(mul(sqrt(square(x)), exp(y))),
      sum(div(sub(x, y), exp(y))),
      sum(log(exp(x))),
      sum(permute(reshape(x, [6, 7, 10]), [2, 0, 1])),
      sum(concat(split(x, [30, 40], 1), 1)),
      sum(layerNorm(x, {
        weight: Tensor.full([70], 1, { gpu, requiresGrad: true }),
        bias: Tensor.full([70], 0, { gpu, requiresGrad: true }),
      })),
      mseLoss(x, y),
      sum(maxPool2d(reshape(x, [1, 6, 7, 10]), { kernelSize: 2 })),
      sum(embedding(
        Tensor.from(range(9 * 8, 9), [9, 8], { gpu, dtype, requiresGrad: true }),
        Tensor.from([1, 3, 8, 3], [4], { dtype: "i32", gpu }),
      )),
    ];
    let total = parts[0];
    for (const p of parts.slice(1)) total = add(total, cast(p, total.dtype));
    total.backward();
    clipGradNorm([leaf], 1);
    const scale = DeviceArray.filled([1], 1024, "f32", gpu);
    const found = DeviceArray.filled([1], 0, "f32", gpu);
    launchUnscaleInto([leaf.grad!], scale, found);
    for (const a of [scale, found]) a.dispose();
  });
}

/** Attention forward and backward under `plan` in `dtype` at head size D (no autograd: as the tuner times it). */
function attentionStep(
  gpu: Gpu,
  dtype: FloatDType,
  headSize: number,
  plan: AttentionPlan,
  variant: { packed: boolean; dropout: boolean },
) {
  const batch = 1, t = 19, heads = 2, c = heads * headSize;
  const shape = { batch, t, heads, headSize, plan };
  const width = variant.packed ? 3 * c : c;
  const make = () => DeviceArray.empty([batch, t, width], dtype, gpu);
  const inputs = variant.packed ? { qkv: make() } : { q: make(), k: make(), v: make() };
  const dropout = variant.dropout
    ? { p: 0.1, range: new RandomGenerator(1).take(batch * heads * t * t) }
    : null;
  const { o, lse } = launchFlashAttention(inputs, shape, dropout);
  const grads = launchFlashAttentionBackward({ inputs, o, lse }, o, shape, dropout);
  for (const a of [...Object.values(inputs), o, lse, ...grads]) a.dispose();
}

/** Pipelines refused for a null-device limit, and the adapter's limit of the same kind. */
const NULL_LIMITS: {
  pattern: RegExp;
  within: (m: RegExpMatchArray, l: Record<string, number>, d: AdapterDescription) => boolean;
}[] = [
  {
    pattern: /total use of workgroup storage \((\d+) bytes\) is larger than the maximum allowed/,
    within: (m, l) => Number(m[1]) <= l.maxComputeWorkgroupStorageSize,
  },
  {
    pattern: /workgroup_size\((\d+), (\d+), (\d+)\) that exceeds the maximum allowed/,
    within: (m, l) =>
      Number(m[1]) <= l.maxComputeWorkgroupSizeX && Number(m[2]) <= l.maxComputeWorkgroupSizeY &&
      Number(m[3]) <= l.maxComputeWorkgroupSizeZ &&
      Number(m[1]) * Number(m[2]) * Number(m[3]) <= l.maxComputeInvocationsPerWorkgroup,
  },
  {
    pattern: /number of workgroup invocations \((\d+)\)/,
    within: (m, l) => Number(m[1]) <= l.maxComputeInvocationsPerWorkgroup,
  },
  {
    pattern: /number of storage buffers \((\d+)\) in the Compute stage exceeds/,
    within: (m, l) => Number(m[1]) <= l.maxStorageBuffersPerShaderStage,
  },
  {
    pattern: /workgroup_size \((\d+)\) must be a multiple of the device maxSubgroupSize/,
    within: (m, _l, d) => Number(m[1]) % d.info.subgroupMaxSize === 0,
  },
];

/**
 * How a pipeline's refusal reads for `description` (see the module comment):
 * a bind-group layout of more storage buffers than the null device's 8 (the
 * first kernel of that layout names the count; later ones find the cached
 * layout invalid) is judged by the kernel's own storage bindings.
 */
function judge(
  message: string,
  storageBindings: number,
  limits: Record<string, number>,
  d: AdapterDescription,
) {
  if (/Invalid BindGroupLayout "halfstep [rwu]+"\] is invalid/.test(message)) {
    return storageBindings <= limits.maxStorageBuffersPerShaderStage ? "beyond-null" : "failed";
  }
  for (const { pattern, within } of NULL_LIMITS) {
    const m = message.match(pattern);
    if (m) return within(m, limits, d) ? "beyond-null" : "failed";
  }
  return "failed";
}

/** Builds every pipeline for `description` (see the module comment); `progress` hears each phase. */
export async function compileEveryPipeline(
  description: AdapterDescription,
  progress: (phase: string) => void = () => {},
): Promise<CompileReport> {
  const gpu = await initGpu({
    backend: "dawn-null",
    adapter: description,
    matmulTiling: "default",
    setDefault: true,
  });
  let tilings = 0, plans = 0;
  const settle = async () => {
    try {
      await gpu.sync();
    } catch { /* a kernel that failed: its outcome is read from the pipeline cache below */ }
  };
  try {
    for (const dtype of dtypesOf(gpu)) {
      progress(`${dtype} ops`);
      opsStep(gpu, dtype);
      await settle();
    }
    for (const options of precisions(gpu)) {
      const dtype: FloatDType = options.enabled === false ? "f32" : options.dtype ?? "f16";
      for (const tiling of tilingsFor(gpu, dtype)) {
        tilings++;
        progress(`${dtype} training steps, matmul ${tilingName(tiling)}`);
        await withTiling(gpu, tiling, async () => {
          mlpStep(gpu, options, "adamw");
          cnnStep(gpu, options);
          gptStep(gpu, options, 64);
          await settle();
        });
      }
      progress(`${dtype} optimizers`);
      mlpStep(gpu, options, "adam");
      mlpStep(gpu, options, "adamw 8bit");
      mlpStep(gpu, options, "adamw bf16");
      mlpStep(gpu, options, "sgd");
      gptStep(gpu, options, 96);
      if (options.enabled !== false) {
        // Half-precision master gradients (apex O2): the check-only unscale, 1/scale, the clip
        // coefficient of scaled gradients, and every optimizer reading f16 or bf16 gradients.
        const half = {
          ...options,
          accumulationSteps: 1,
          maxGradNorm: 1,
          gradDtype: options.dtype ?? "f16",
        };
        for (const o of ["adamw", "adamw 8bit", "adamw bf16", "adam", "sgd"] as const) {
          mlpStep(gpu, half, o);
        }
      }
      await settle();
    }
    for (const dtype of dtypesOf(gpu)) {
      for (const headSize of [24, 64]) {
        // The tuner's candidates, and the plan `attentionPlan: "subgroup-matrix"` forces.
        const matrix = attentionMatrixFor(gpu, headSize, dtype);
        const [matrixBackward] = matrixBackwardsFor(gpu, headSize, dtype);
        const candidates = [
          DEFAULT_ATTENTION_PLAN,
          ...attentionPlanCandidates(gpu, headSize, dtype),
          ...(matrix && matrixBackward
            ? [{ ...DEFAULT_ATTENTION_PLAN, matrix }, {
              ...DEFAULT_ATTENTION_PLAN,
              matrix,
              matrixBackward,
            }]
            : []),
        ];
        progress(`${dtype} attention, D = ${headSize}: ${candidates.length} plans`);
        for (const plan of candidates) {
          plans++;
          for (
            const variant of [{ packed: true, dropout: false }, { packed: false, dropout: true }]
          ) {
            attentionStep(gpu, dtype, headSize, plan, variant);
          }
        }
        await settle();
      }
    }
    await settle();
    // Outcomes resolve asynchronously: wait until none is pending.
    for (let i = 0; i < 200; i++) {
      if (![...gpu.pipelines.entries()].some((k) => k.compiled.state === "pending")) break;
      await new Promise((r) => setTimeout(r, 10));
    }
    const limits = describedLimits(description, gpu.device.limits);
    const pipelines: PipelineOutcome[] = [...gpu.pipelines.entries()].map((k) => {
      const c = k.compiled;
      if (c.state === "ok") return { key: k.key, outcome: "ok" };
      const message = c.state === "failed" ? c.error.message : "still pending";
      const outcome = judge(message, k.bindings.length, limits, description);
      return { key: k.key, outcome, message };
    });
    const families = new Map<string, Set<string>>();
    for (const { key } of pipelines) {
      const family = key.slice(0, key.indexOf("{"));
      const dtype = key.match(/[{,]dtype=(\w+)/)?.[1] ?? "-";
      if (!families.has(family)) families.set(family, new Set());
      families.get(family)!.add(dtype);
    }
    const unbuilt = definedKernels().map((d) => d.name).filter((name) => !families.has(name));
    return { adapter: description.name, pipelines, families, unbuilt, tilings, plans };
  } finally {
    gpu.destroy();
  }
}

export type { DType };
