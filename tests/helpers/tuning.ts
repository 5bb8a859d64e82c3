/**
 * What the tuner tests share: a tuning store in memory (so a test's picks
 * never reach the user's cache file, and a test starts from an empty one)
 * and scripted timers that say which candidate wins and count their calls.
 */
import { setTuningStore, type TuningStore } from "../../gpu/tuning/store.ts";
import type { AdapterProfile } from "../../gpu/mod.ts";
import { gpuLikeProfile } from "../../gpu/tuning/profile_switch.ts";
import { gpu } from "./gpu.ts";

/** A store that keeps its entries in a map: a cache the test can read and clear. */
export function memoryStore(): TuningStore & { entries: Map<string, string> } {
  const entries = new Map<string, string>();
  return {
    entries,
    where: "memory (test)",
    getItem: (key) => entries.get(key) ?? null,
    setItem: (key, value) => void entries.set(key, value),
    removeItem: (key) => void entries.delete(key),
    keys: () => [...entries.keys()],
  };
}

/** Runs `fn` with an empty {@link memoryStore} as the tuners' store, then the old one again. */
export async function withMemoryStore<T>(
  fn: (store: ReturnType<typeof memoryStore>) => Promise<T>,
): Promise<T> {
  const store = memoryStore();
  const earlier = setTuningStore(store);
  try {
    return await fn(store);
  } finally {
    setTuningStore(earlier);
  }
}

/**
 * A timer under which `winner` is the fastest candidate (1 ms against 2 ms
 * and up for the others, so ties never decide), counting its calls.
 */
export function favouring<C>(winner: (candidate: C) => boolean) {
  const calls: C[] = [];
  const timer = (candidate: C) => {
    calls.push(candidate);
    return Promise.resolve(winner(candidate) ? 1e-3 : 2e-3 + calls.length * 1e-6);
  };
  return { timer, calls };
}

/**
 * Two GPU profiles that one product is tuned under: the GPU-like one (an
 * H100's limits) and one with WebGPU's default 16 KiB of workgroup memory
 * and an A100's 108 multiprocessors, named apart as two adapters are.
 */
export function twoProfiles(): [AdapterProfile, AdapterProfile] {
  const small = gpuLikeProfile(gpu, { maxComputeWorkgroupStorageSize: 16384 });
  return [gpuLikeProfile(gpu), { ...small, name: "gpu-like 16 KiB", multiprocessors: 108 }];
}
