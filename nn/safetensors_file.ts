/**
 * Saving and loading safetensors files with Deno's file APIs. The format
 * itself (pure Web APIs, usable in browsers) is in `safetensors.ts`.
 */
import { dirname, isAbsolute, join } from "node:path";
import { checkOptionNames, fail, quoted, type Tensor, ValueError } from "../gpu/mod.ts";
import { isHostTensor, type LoadStateOptions, type Module, nonFiniteSummary } from "./module.ts";
import {
  decodeSafetensors,
  encodeSafetensorsHeader,
  type SafetensorsEntry,
  SafetensorsError,
  type SafetensorsSpec,
  storedTensors,
  tensorToEntry,
} from "./safetensors.ts";
import { refuseReservedKey, withChecksums } from "./checksum.ts";

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.byteLength;) at += await file.write(bytes.subarray(at));
}

/** The same error class (so `instanceof Deno.errors.NotFound` still works) with a new message. */
function rethrow(err: unknown, message: string): never {
  if (!(err instanceof Error)) throw new Error(`${message}: ${String(err)}`, { cause: err });
  const Type = err.constructor as new (message: string, options?: ErrorOptions) => Error;
  let wrapped: Error;
  try {
    wrapped = new Type(`${message}: ${err.message}`, { cause: err });
  } catch {
    wrapped = new Error(`${message}: ${err.message}`, { cause: err });
  }
  throw wrapped;
}

/** Options of {@link saveSafetensors} and {@link saveModule}. */
export interface SaveOptions {
  /** Free-form string → string map stored in the header (`__metadata__`). */
  metadata?: Record<string, string>;
  /**
   * Save float tensors that hold NaN or ±Inf (default false: the save is
   * refused, naming the tensor, so a diverged run never replaces a good file).
   */
  allowNonFinite?: boolean;
}

/**
 * Writes tensors to a safetensors file **atomically**: into
 * `${path}.tmp-<random>` in the same directory, fsync, close, then rename onto
 * `path`. On any error the temporary file is removed and a file already at
 * `path` is left untouched; temporaries a killed process left behind are
 * removed by the next save to the same path. **A sync point**: waits for the GPU once (all
 * tensors are read back together) and holds their bytes in memory meanwhile.
 * Tensors holding NaN or ±Inf are refused unless `options.allowNonFinite`.
 * The metadata also holds a checksum per tensor, which loading verifies.
 *
 * @param path Destination file.
 * @param tensors Name → tensor, as a record or a Map; a value may also be host
 * data (`{ dtype, shape, data }`, as `loadSafetensors` gives it), written as it is.
 * @param options `metadata` (string → string, stored in the header) and `allowNonFinite`.
 * @returns When the file is durably in place.
 * @throws {ValueError} for non-finite values (nothing written); otherwise the
 * underlying error (same class), its message naming `path`.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Tensor } from "../mod.ts";
 * import { loadSafetensors, saveSafetensors } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/model.safetensors`;
 * const w = Tensor.from([1, 2, 3, 4], [2, 2]), b = Tensor.zeros([2]);
 * await saveSafetensors(path, { "fc1.weight": w, "fc1.bias": b }, { metadata: { step: "1000" } });
 * assert.equal((await loadSafetensors(path)).metadata.step, "1000");
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function saveSafetensors(
  path: string,
  tensors: Record<string, Tensor | SafetensorsEntry> | Map<string, Tensor | SafetensorsEntry>,
  options: SaveOptions = {},
): Promise<void> {
  await writeTensors("saveSafetensors", path, tensors, options);
}

/**
 * {@link saveSafetensors}, with `where` (the public function's name, e.g.
 * `"saveTrainingState"`) opening its errors, for the savers built on it.
 */
export async function writeTensors(
  where: string,
  path: string,
  tensors: Record<string, Tensor | SafetensorsEntry> | Map<string, Tensor | SafetensorsEntry>,
  options: SaveOptions,
): Promise<void> {
  checkOptionNames(
    where,
    options,
    ["metadata", "allowNonFinite"],
    "a metadata map goes in { metadata } (it was the third argument in earlier versions).",
  );
  const byName = tensors instanceof Map ? tensors : new Map(Object.entries(tensors));
  const specs = new Map<string, SafetensorsSpec>();
  for (const [name, t] of byName) specs.set(name, { dtype: t.dtype, shape: t.shape });
  let order: string[];
  try {
    // Validates names, dtypes, shapes and metadata before anything is read or written.
    refuseReservedKey(where, options.metadata);
    ({ order } = encodeSafetensorsHeader(specs, options.metadata));
  } catch (err) {
    rethrow(err, `${where}: cannot write "${path}"`);
  }
  // Start every readback before awaiting any: one GPU wait instead of one per tensor.
  const reads = order.map((name) => {
    const value = byName.get(name)!;
    return isHostTensor(value) ? Promise.resolve(value) : tensorToEntry(value);
  });
  for (const read of reads) read.catch(() => {}); // failures surface below, in order
  const entries: SafetensorsEntry[] = [];
  try {
    for (const read of reads) entries.push(await read);
  } catch (err) {
    rethrow(err, `${where}: cannot write "${path}" (left unchanged)`);
  }
  if (!options.allowNonFinite) refuseNonFinite(where, path, order, entries);
  const read = new Map(order.map((name, i) => [name, entries[i]]));
  const metadata = withChecksums(storedTensors(read), options.metadata);
  const { prefix } = encodeSafetensorsHeader(specs, metadata);
  // A symbolic link stays one: the save replaces the file it names.
  const target = await linkTarget(path);
  await removeStaleTemporaries(target);
  const temp = `${target}${TEMP_INFIX}${crypto.randomUUID()}`;
  let file: Deno.FsFile | null = null;
  try {
    file = await Deno.open(temp, { write: true, createNew: true });
    await writeAll(file, prefix);
    for (const entry of entries) await writeAll(file, entry.data);
    await file.sync();
    file.close();
    file = null;
    await Deno.rename(temp, target);
  } catch (err) {
    try {
      file?.close();
    } catch { /* already closed */ }
    await Deno.remove(temp).catch(() => {}); // may never have been created
    rethrow(err, `${where}: cannot write "${path}" (left unchanged)`);
  }
  await syncDirectory(target);
}

/**
 * The file `path` names: the target of a symbolic link (followed to the
 * end; a dangling link's target, which a save creates), else `path`
 * itself — also where the permissions do not let it be checked. A save
 * writes there (a link stays a link), and a lock beside the file it names
 * is the same whichever name a run was given.
 *
 * @param path A file's path, maybe a symbolic link's.
 * @returns The path of the file a write to `path` replaces.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { linkTarget } from "../files.ts";
 * const dir = await Deno.realPath(await Deno.makeTempDir());
 * await Deno.writeTextFile(`${dir}/run.safetensors`, "");
 * await Deno.symlink(`${dir}/run.safetensors`, `${dir}/latest.safetensors`);
 * assert.equal(await linkTarget(`${dir}/latest.safetensors`), `${dir}/run.safetensors`);
 * assert.equal(await linkTarget(`${dir}/new.safetensors`), `${dir}/new.safetensors`);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function linkTarget(path: string): Promise<string> {
  try {
    if (!(await Deno.lstat(path)).isSymlink) return path;
  } catch {
    return path; // nothing there yet, or no read permission
  }
  try {
    return await Deno.realPath(path);
  } catch {
    const link = await Deno.readLink(path).catch(() => null);
    return link === null ? path : isAbsolute(link) ? link : join(dirname(path), link);
  }
}

/**
 * Throws when a read-back tensor holds NaN or ±Inf (checked on the bytes
 * already on the CPU, so it costs no GPU wait), before any file is touched.
 */
function refuseNonFinite(
  where: string,
  path: string,
  order: readonly string[],
  entries: readonly SafetensorsEntry[],
): void {
  const bad = nonFiniteSummary(entries.map((e, i) => [order[i], e] as const));
  if (bad === null) return;
  fail(
    ValueError,
    `${where}: ${quoted(path)}`,
    `${bad} (NaN or ±Inf: training has diverged); the file was left unchanged. ` +
      "Pass { allowNonFinite: true } to save it anyway.",
  );
}

/** Temporaries are `${path}.tmp-<uuid>`. */
const TEMP_INFIX = ".tmp-";
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * Best effort: removes temporaries of `path` that an earlier save left behind
 * when its process was killed mid-write (a save that fails by itself removes
 * its own). Two processes saving to the same path at once are not supported.
 */
async function removeStaleTemporaries(path: string): Promise<void> {
  const slash = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"));
  const dir = slash < 0 ? "." : path.slice(0, slash + 1) || "/";
  const prefix = path.slice(slash + 1) + TEMP_INFIX;
  try {
    for await (const entry of Deno.readDir(dir)) {
      const suffix = entry.name.slice(prefix.length);
      if (entry.isFile && entry.name.startsWith(prefix) && UUID.test(suffix)) {
        await Deno.remove(`${slash < 0 ? "" : dir}${entry.name}`).catch(() => {});
      }
    }
  } catch { /* no read permission for the folder: leave them */ }
}

/**
 * Best effort: fsync the directory so the rename itself survives a crash.
 * NOTE: not possible everywhere (Windows cannot open directories), so ignored there.
 */
async function syncDirectory(path: string): Promise<void> {
  const slash = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"));
  const dir = slash < 0 ? "." : slash === 0 ? path.slice(0, 1) : path.slice(0, slash);
  try {
    const handle = await Deno.open(dir, { read: true });
    try {
      await handle.sync();
    } finally {
      handle.close();
    }
  } catch { /* unsupported here; the data itself was already synced */ }
}

/** A header longer than this is refused before it is read (safetensors' own bound). */
const MAX_HEADER_BYTES = 100_000_000;

/** Up to `count` bytes from `file` (fewer at its end), read in chunks: nothing is allocated ahead. */
async function readUpTo(file: Deno.FsFile, count: number): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let got = 0;
  while (got < count) {
    const chunk = new Uint8Array(Math.min(count - got, 1 << 24));
    const n = await file.read(chunk);
    if (n === null) break;
    chunks.push(chunk.subarray(0, n));
    got += n;
  }
  return concat(chunks);
}

/** `parts` in one array. */
function concat(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((sum, p) => sum + p.byteLength, 0));
  let at = 0;
  for (const p of parts) (out.set(p, at), at += p.byteLength);
  return out;
}

/** The end of the data the header text describes (0 when it is not a header: decoding says why). */
function dataEnd(header: Uint8Array): number {
  try {
    const infos = Object.values(JSON.parse(new TextDecoder().decode(header)) ?? {});
    const ends = infos.map((i) => (i as { data_offsets?: unknown[] })?.data_offsets?.[1]);
    return Math.max(0, ...ends.filter((e): e is number => Number.isSafeInteger(e)));
  } catch {
    return 0;
  }
}

/**
 * The bytes of a safetensors file, read in bounded steps: the 8-byte header
 * length first (at most 100 MB), then the rest of a regular file (its size
 * bounds the read), or from anything else (a device such as /dev/zero, a
 * pipe) the header and only the data bytes it describes, so no path makes a
 * load read without end. Whatever is short or wrong is left to
 * `decodeSafetensors`, which names it.
 */
async function readBounded(path: string): Promise<Uint8Array> {
  const file = await Deno.open(path, { read: true });
  try {
    const info = await file.stat();
    const head = await readUpTo(file, 8);
    if (head.byteLength < 8) return head;
    const n = new DataView(head.buffer).getBigUint64(0, true);
    if (n > BigInt(MAX_HEADER_BYTES)) return head;
    const parts = [head];
    if (info.isFile) parts.push(await readUpTo(file, info.size - 8));
    else {
      parts.push(await readUpTo(file, Number(n)));
      parts.push(await readUpTo(file, dataEnd(parts[1])));
    }
    return concat(parts);
  } finally {
    file.close();
  }
}

/**
 * Reads and validates a safetensors file (see `decodeSafetensors`). Does not
 * touch the GPU: turn entries into tensors with `entryToTensor`.
 *
 * @param path The file.
 * @returns The tensors by name and the `__metadata__` map.
 * @throws {SafetensorsError} for a malformed file, or the file system's error
 * (same class), the message naming `path` either way.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Tensor } from "../mod.ts";
 * import { entryToTensor } from "./mod.ts";
 * import { loadSafetensors, saveSafetensors } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/model.safetensors`;
 * await saveSafetensors(path, { "fc1.weight": Tensor.from([1, 2, 3, 4], [2, 2]) });
 * const { entries, metadata } = await loadSafetensors(path);
 * const w = entryToTensor(entries.get("fc1.weight")!);
 * assert.equal((await w.read()).join(), "1,2,3,4");
 * assert.equal(Object.keys(metadata).length, 0);
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function loadSafetensors(
  path: string,
): Promise<{ entries: Map<string, SafetensorsEntry>; metadata: Record<string, string> }> {
  let bytes: Uint8Array;
  try {
    bytes = await readBounded(path);
  } catch (err) {
    rethrow(err, `loadSafetensors: cannot read "${path}"`);
  }
  try {
    return decodeSafetensors(bytes);
  } catch (err) {
    if (!(err instanceof SafetensorsError)) throw err;
    throw new SafetensorsError(`"${path}" is not a valid safetensors file: ${err.message}`, {
      cause: err,
    });
  }
}

/**
 * Saves a module's state dict (parameters and buffers, dotted names) as a
 * safetensors file, atomically. **A sync point** (see {@link saveSafetensors}).
 * Weights holding NaN or ±Inf are refused unless `options.allowNonFinite`.
 *
 * @param path Destination file.
 * @param module The model.
 * @param options `metadata` (string → string, stored in the header) and `allowNonFinite`.
 * @returns When the file is in place.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear } from "../mod.ts";
 * import { loadSafetensors, saveModule } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/mlp.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 });
 * await saveModule(path, model);
 * const { entries } = await loadSafetensors(path);
 * assert.equal([...entries.keys()].sort().join(), "bias,weight");
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function saveModule(
  path: string,
  module: Module,
  options: SaveOptions = {},
): Promise<void> {
  await writeTensors("saveModule", path, module.stateDict(), options);
}

/**
 * Loads a safetensors file into a module. The whole file is read and checked
 * against the module (names, shapes, dtypes, sizes) before anything is
 * written, so a truncated, corrupt or mismatched file — or one whose values
 * hold NaN or ±Inf, unless `options.allowNonFinite` — is a clear error that
 * names the tensor and leaves the module unchanged.
 *
 * @param path The file.
 * @param module The model to fill.
 * @param options `{ allowNonFinite }` to load NaN / ±Inf values anyway.
 * @returns The file's metadata.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { initGpu, Linear } from "../mod.ts";
 * import { loadModule, saveModule } from "../files.ts";
 * const gpu = await initGpu({ matmulTiling: "default" });
 * const dir = await Deno.makeTempDir(), path = `${dir}/mlp.safetensors`;
 * const model = new Linear(4, 2, { seed: 1 }), copy = new Linear(4, 2, { seed: 2 });
 * await saveModule(path, model, { metadata: { epoch: "3" } });
 * const metadata = await loadModule(path, copy);
 * const same = (await copy.weight.read()).join() === (await model.weight.read()).join();
 * assert.ok(same);
 * assert.equal(metadata.epoch, "3");
 * await Deno.remove(dir, { recursive: true });
 * gpu.destroy();
 * ```
 */
export async function loadModule(
  path: string,
  module: Module,
  options: LoadStateOptions = {},
): Promise<Record<string, string>> {
  const { entries, metadata } = await loadSafetensors(path);
  try {
    module.loadStateDict(entries, options);
  } catch (err) {
    throw new ValueError(`loadModule: ${quoted(path)}: ${(err as Error).message}`, { cause: err });
  }
  return metadata;
}
