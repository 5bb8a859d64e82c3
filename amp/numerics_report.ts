/**
 * What {@link NumericsReport} is made of: the row and parameter statistics
 * and the first non-finite tensor, decoded from the statistics buffer's words
 * read back (`raw`, null before any tensor was counted) and the CPU's row table.
 */
import type { DType, OpName } from "../gpu/mod.ts";
import { HEADER, HEADER_WORDS, NONE, ROW, ROW_WORDS } from "./kernels/numerics_stats.ts";

/** Whether a row counts op outputs (forward) or the gradients rules produce (backward). */
export type NumericsPhase = "forward" | "backward";

/** Counts over every value an inspector saw in one place (op rows and parameter rows share them). */
export interface NumericsCounts {
  /** Tensors counted. */
  calls: number;
  /** Values counted (elements summed over the calls). */
  values: number;
  /** NaN and ±Inf values. */
  nonFinite: number;
  /** Finite values with |x| > 65504, which overflow if cast to f16. */
  overflowF16: number;
  /** Nonzero values with |x| < 2^-14: subnormal in f16, or flushed to zero if cast. */
  underflowF16: number;
  /** Zeros (either sign). */
  zeros: number;
  /** The largest finite |x| (0 when none). */
  amax: number;
}

/** One row of {@link NumericsReport.rows}: an op run by one module, in one phase and dtype. */
export interface NumericsRow extends NumericsCounts {
  /** The module path that ran the op (`"blocks.2.fc1"`), or `op:index` outside submodules. */
  name: string;
  /** The op's registry name. */
  op: OpName;
  /** Forward: the op's outputs; backward: the gradients its rule produced. */
  phase: NumericsPhase;
  /** The dtype of the tensors counted. */
  dtype: DType;
}

/**
 * The gradients of one parameter, as f16 holds them (under autocast, the
 * gradient of its f16 working copy; else its own), each contribution of a
 * step counted separately, before unscaling.
 */
export interface ParameterGradientRow extends NumericsCounts {
  /** The parameter's state-dict name. */
  name: string;
  /** The gradient's dtype. */
  dtype: DType;
  /** `underflowF16 / values`: the share that f16 cannot hold as a normal number at the scale used. */
  underflowFraction: number;
}

/** Where the first NaN/Inf appeared (see {@link NumericsReport.firstNonFinite}). */
export interface FirstNonFinite {
  /** The step (0-based count of `watch` calls / trainer micro-batches). */
  step: number;
  /** The row's name. */
  name: string;
  /** The op. */
  op: OpName;
  /** Its phase. */
  phase: NumericsPhase;
  /** Which call of that row within the step (0 = the first). */
  call: number;
  /** The loss scale in force then, or null when no scaler was given. */
  scale: number | null;
}

/** How often an op ran, per output dtype. */
export interface OpDtypeCount {
  /** The op. */
  op: OpName;
  /** Forward calls per output dtype. */
  calls: Partial<Record<DType, number>>;
}

/** What {@link NumericsInspector.report} returns. */
export interface NumericsReport {
  /** Steps watched. */
  steps: number;
  /** One row per (name, op, phase, dtype), in order of first appearance. */
  rows: NumericsRow[];
  /** The first op output or gradient, in execution order, holding NaN/Inf; null if none did. */
  firstNonFinite: FirstNonFinite | null;
  /** Calls per op and dtype (Paddle's operator statistics). */
  ops: OpDtypeCount[];
  /** Gradient statistics per parameter, for loss-scale advice. */
  params: ParameterGradientRow[];
  /** The loss scale in force now, when the last step was given a scaler; else null. */
  lossScale: number | null;
}

/** A row as the CPU keeps it: what it counts, and how many tensors and values. @internal */
export interface RowInfo {
  name: string;
  op: OpName;
  phase: NumericsPhase;
  dtype: DType;
  calls: number;
  values: number;
  /** A parameter's gradient row (op is the producing op of its first gradient). */
  param: boolean;
}

/** The public fields of a row. */
function rowOf({ name, op, phase, dtype }: RowInfo): Omit<NumericsRow, keyof NumericsCounts> {
  return { name, op, phase, dtype };
}

/** The GPU-side part of a report, decoded. @internal */
export function decodeStats(
  raw: Int32Array | Float32Array | null,
  infos: readonly RowInfo[],
): Pick<NumericsReport, "rows" | "params" | "firstNonFinite"> {
  raw ??= new Int32Array(HEADER_WORDS).fill(-1);
  const words = new Uint32Array(raw.buffer, raw.byteOffset, raw.length);
  const floats = new Float32Array(raw.buffer, raw.byteOffset, raw.length);
  const counts = (row: number, info: RowInfo): NumericsCounts => {
    const at = HEADER_WORDS + row * ROW_WORDS;
    // A row past the buffer's end never had a tensor counted (none, or only empty ones).
    const wide = (w: number) => (words[at + w] ?? 0) + (words[at + w + 1] ?? 0) * 2 ** 32;
    return {
      calls: info.calls,
      values: info.values,
      nonFinite: wide(ROW.nonFinite),
      overflowF16: wide(ROW.overflowF16),
      underflowF16: wide(ROW.underflowF16),
      zeros: wide(ROW.zeros),
      amax: floats[at + ROW.amax] ?? 0,
    };
  };
  const rows: NumericsRow[] = [];
  const params: ParameterGradientRow[] = [];
  infos.forEach((info, i) => {
    const c = counts(i, info);
    if (!info.param) rows.push({ ...rowOf(info), ...c });
    else {
      params.push({
        name: info.name,
        dtype: info.dtype,
        ...c,
        underflowFraction: c.values > 0 ? c.underflowF16 / c.values : 0,
      });
    }
  });
  let firstNonFinite: FirstNonFinite | null = null;
  if (words[HEADER.firstSeq] !== NONE) {
    const row = infos[words[HEADER.firstRow]];
    const scale = floats[HEADER.firstScale];
    firstNonFinite = {
      step: words[HEADER.firstStep],
      name: row.name,
      op: row.op,
      phase: row.phase,
      call: words[HEADER.firstCall],
      scale: Number.isNaN(scale) ? null : scale,
    };
  }
  return { rows, params, firstNonFinite };
}
