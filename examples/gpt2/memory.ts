/**
 * What a GPT-2 run will allocate, for the preflight (`cli/preflight.ts`): its
 * largest GPU buffers, and an estimate of a training step's whole peak, which
 * on a CPU adapter (lavapipe: GPU memory is host memory) is checked against
 * the host's available memory. Keep it in step with the model: bench.ts gpt2
 * prints the measured peak beside this estimate.
 *
 * @module
 */
import { LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS } from "../../mod.ts";
import type { Growth, PlannedBuffer } from "../cli/preflight.ts";
import { stateBytesPerParameter } from "../cli/optim_states_flag.ts";
import type { GradDType, StateDtype } from "../../mod.ts";
import { gpt2Config, type Gpt2Sizes } from "../../models/gpt2.ts";

/** The flags that size a run (training is off when `training` is false). */
export interface Gpt2RunSizes {
  batch: number;
  context: number;
  amp: boolean;
  checkpoint: boolean;
  training: boolean;
  /** Positions a sample's KV cache holds. */
  sampleLength: number;
  /** How AdamW keeps its moments (default f32: 8 bytes a parameter; 8bit: 2, bf16: 4). */
  optimStates?: StateDtype;
  /** What the masters' gradients are kept in (default f32: 4 bytes a parameter; f16, bf16: 2). */
  gradDtype?: GradDType;
}

const grow = (flag: string, value: number, power = 1): Growth => ({ flag, value, power });

/** Parameters of GPT-2 of these sizes (the head is the token table). */
export function gpt2Parameters(s: Gpt2Sizes): number {
  return (s.vocab + s.context) * s.dim + s.layers * (12 * s.dim * s.dim + 13 * s.dim) + 2 * s.dim;
}

/**
 * An estimate of a training step's peak bytes: the larger of two moments.
 * In backward: the f32 weights and their gradients (8 bytes a parameter,
 * plus 2 for AMP's working copies), what the blocks keep (per token: 48C
 * bytes a block in f32, 32C under AMP: GPT-2 124M's AMP step at 8 × 512
 * measured about 30C; with checkpointing 4C a block plus one block recomputed), the head's rows, a chunk's logits and
 * their gradient, and the token table's gradient arriving in two parts. At
 * the optimizer step: weights, gradients and the AdamW moments (16 bytes a
 * parameter, plus 2; 8-bit moments take 2 bytes instead of 8 and bf16 ones 4,
 * `optimStates`) and two more table-sized buffers. Ten percent is added
 * for what the pool rounds up and small buffers; tests/examples/gpt2_memory_test.ts checks
 * the estimate against measured peaks (never below, at most 1.5 times).
 */
export function gpt2StepPeakBytes(s: Gpt2Sizes, run: Gpt2RunSizes): number {
  const p = gpt2Parameters(s), rows = run.batch * run.context, c = s.dim;
  const half = run.amp ? 2 : 0, table = 4 * s.vocab * c;
  const perBlock = (run.amp ? 32 : 48) * c * rows;
  const blocks = run.checkpoint ? s.layers * 4 * c * rows + perBlock : s.layers * perBlock;
  const chunk = Math.min(
    rows,
    Math.max(1, Math.floor(LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS / s.vocab)),
  );
  const logits = chunk * s.vocab * (run.amp ? 2 : 4);
  // Weights 4 bytes a parameter, gradients 4 (2 in f16 or bf16: apex O2's half gradients).
  const fixed = 4 + (run.gradDtype && run.gradDtype !== "f32" ? 2 : 4);
  const backward = p * (fixed + half) + blocks + rows * c * (4 + half) + 2 * logits + 2 * table;
  const moments = stateBytesPerParameter(run.optimStates ?? "f32");
  const optimizer = p * (fixed + moments + half) + 2 * table;
  return Math.ceil(1.1 * Math.max(backward, optimizer));
}

/**
 * The largest GPU buffers of training, validation and sampling, and what the
 * host holds at once (the weights file, the tokens), with the flags each
 * grows with; on a CPU adapter also the step's estimated peak.
 */
export function gpt2Buffers(
  s: Gpt2Sizes,
  run: Gpt2RunSizes,
  host: { fileBytes: number; tokens: number; cpuAdapter: boolean; maxBufferBytes: number },
): { gpu: PlannedBuffer[]; host: PlannedBuffer[] } {
  const rows = run.batch * run.context, c = s.dim;
  const f32 = (what: string, shape: number[], grows: Growth[]): PlannedBuffer => ({
    what: `${what} f32 [${shape.join(", ")}]`,
    bytes: 4 * shape.reduce((a, b) => a * b, 1),
    grows,
  });
  const byRows = [grow("batch", run.batch), grow("context", run.context)];
  const chunk = Math.min(
    rows,
    Math.max(1, Math.floor(LINEAR_CROSS_ENTROPY_CHUNK_ELEMENTS / s.vocab)),
  );
  const pieces = gpt2Config(s, 0, host.maxBufferBytes).tableShards ?? 1;
  const gpu = [
    f32(`the token table (wte)${pieces > 1 ? `'s ${pieces} column pieces, each` : ""}`, [
      s.vocab,
      c / pieces,
    ], []),
    f32("a KV cache of one block", [s.heads, run.sampleLength, c / s.heads], [
      grow("max-new-tokens", run.sampleLength),
    ]),
  ];
  if (run.training) {
    gpu.push(
      f32("the MLP's hidden rows", [rows, 4 * c], byRows),
      f32("the attention's q, k, v", [rows, 3 * c], byRows),
      f32("a chunk of the head's logits", [chunk, s.vocab], []),
    );
  }
  const hostBuffers: PlannedBuffer[] = [
    { what: "the weights file", bytes: host.fileBytes, grows: [] },
    { what: `the text's ${host.tokens} tokens`, bytes: 4 * host.tokens, grows: [] },
  ];
  if (run.training && host.cpuAdapter) {
    hostBuffers.push({
      what: "a training step's GPU memory (estimated; this adapter's memory is the host's)",
      bytes: gpt2StepPeakBytes(s, run),
      grows: byRows,
    });
  }
  return { gpu, host: hostBuffers };
}
