/**
 * Before the first step: the largest buffers a run will allocate (listed by
 * the model's file, so the list stays next to the code it describes) against
 * what one buffer may hold on this adapter and what the host can allocate.
 * A run that cannot fit stops at once with one line naming the flag to lower
 * and about how far, instead of failing an epoch later with a stack trace.
 *
 * @module
 */
import type { Gpu } from "../../mod.ts";
import { UsageError } from "./flags.ts";

/** A flag a buffer's size grows with: bytes ∝ value^power. */
export interface Growth {
  flag: string;
  value: number;
  power: number;
}

/** One buffer a run allocates, its bytes, and the flags its size grows with. */
export interface PlannedBuffer {
  /** What it holds, with its shape, e.g. `conv1 output f32 [10000, 32, 26, 26]`. */
  what: string;
  bytes: number;
  grows: Growth[];
}

/** What the run's buffers must fit in. */
export interface Limits {
  /** The most bytes one GPU buffer may hold and a kernel bind. */
  bufferBytes: number;
  /** The adapter limit that sets `bufferBytes`. */
  bufferLimit: string;
  /** Memory the host can still give (its available memory). */
  hostBytes: number;
}

/** The adapter's one-buffer limit and the host's available memory. */
export function runLimits(gpu: Gpu): Limits {
  const { maxBufferSize, maxStorageBufferBindingSize } = gpu.device.limits;
  const storage = maxStorageBufferBindingSize <= maxBufferSize;
  return {
    bufferBytes: Math.min(maxBufferSize, maxStorageBufferBindingSize),
    bufferLimit: storage ? "maxStorageBufferBindingSize" : "maxBufferSize",
    hostBytes: hostAvailableBytes(),
  };
}

/**
 * The host's available memory: Deno.systemMemoryInfo() with --allow-sys,
 * else /proc/meminfo's MemAvailable (the examples run without --allow-sys),
 * else unknown (Infinity: nothing is refused for the host).
 */
function hostAvailableBytes(): number {
  if (Deno.permissions.querySync({ name: "sys", kind: "systemMemoryInfo" }).state === "granted") {
    return Deno.systemMemoryInfo().available;
  }
  try {
    const kib = Deno.readTextFileSync("/proc/meminfo").match(/^MemAvailable:\s+(\d+) kB/m)?.[1];
    return kib ? Number(kib) * 1024 : Infinity;
  } catch {
    return Infinity;
  }
}

/** `bytes` for people: 865.3 MB. */
export function formatBytes(bytes: number): string {
  const units = ["bytes", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (bytes >= 1000 && i < units.length - 1) bytes /= 1000, i++;
  return `${i === 0 ? bytes : bytes.toFixed(1)} ${units[i]}`;
}

/**
 * The flag to lower so that `buffer` shrinks to `limit` bytes, and about to
 * what: of the flags it grows with, the one furthest above its default.
 */
function advice(buffer: PlannedBuffer, limit: number, defaults: Record<string, number>): string {
  if (buffer.grows.length === 0) return "this model does not fit this adapter";
  const growth = buffer.grows.reduce((a, b) =>
    b.value / (defaults[b.flag] ?? 1) > a.value / (defaults[a.flag] ?? 1) ? b : a
  );
  const to = Math.floor(growth.value * (limit / buffer.bytes) ** (1 / growth.power));
  return to >= 1
    ? `lower --${growth.flag} to about ${to}`
    : `lower --${buffer.grows.map((g) => g.flag).join(", --")}`;
}

const NOTHING: PlannedBuffer = { what: "nothing", bytes: 0, grows: [] };

/**
 * Throws a UsageError when one of `gpu` exceeds the one-buffer limit or
 * `host` (held at once) the host's memory; the message names the buffer, its
 * size, the limit, and the flag to lower (`defaults` are the flags' defaults).
 */
export function checkPlan(
  plan: { gpu: PlannedBuffer[]; host: PlannedBuffer[] },
  limits: Limits,
  defaults: Record<string, number>,
): void {
  const largest = plan.gpu.reduce((a, b) => (b.bytes > a.bytes ? b : a), NOTHING);
  if (largest.bytes > limits.bufferBytes) {
    throw new UsageError(
      `${largest.what} needs ${formatBytes(largest.bytes)}, over this adapter's ` +
        `${limits.bufferLimit} of ${formatBytes(limits.bufferBytes)}: ` +
        `${advice(largest, limits.bufferBytes, defaults)}.`,
    );
  }
  const hostBytes = plan.host.reduce((sum, b) => sum + b.bytes, 0);
  if (hostBytes > limits.hostBytes) {
    const biggest = plan.host.reduce((a, b) => (b.bytes > a.bytes ? b : a), NOTHING);
    const room = limits.hostBytes - (hostBytes - biggest.bytes);
    throw new UsageError(
      `${biggest.what} needs ${formatBytes(biggest.bytes)} of host memory, with ` +
        `${formatBytes(limits.hostBytes)} available: ` +
        `${advice(biggest, Math.max(room, 1), defaults)}.`,
    );
  }
}
