/**
 * Where the tuners keep their winners: a per-user cache that every script
 * shares, and that can never stop a run.
 *
 * - In Deno, a JSON file `tuning-<halfstep version>.json` in
 *   `$HALFSTEP_CACHE_DIR`, else `$XDG_CACHE_HOME/halfstep`, else
 *   `~/.cache/halfstep` (`%LOCALAPPDATA%\halfstep` on Windows), written
 *   atomically (a temporary file renamed over it) under an OS lock on
 *   `tuning-<version>.json.lock`, so entries other processes write at the
 *   same time are kept. Its entries are keyed by tuner, adapter
 *   (name, vendor, device, architecture: what WebGPU tells of the driver) and
 *   profile; the file name carries halfstep's version, so another version's
 *   kernels are measured afresh.
 * - In browsers, `localStorage`.
 * - Deno's file API is reached through `globalThis.Deno` at run time and the
 *   permissions are asked without a prompt (`Deno.permissions.querySync`),
 *   so this module loads in browsers and by URL. Where the file may not be
 *   read and written (no `--allow-read`/`--allow-write` for the folder, or no
 *   `--allow-env` to find it), Deno's `localStorage` keeps the winners for
 *   this script only; where there is none, memory for this run. A damaged,
 *   unreadable or read-only cache file is left alone and the run tunes in
 *   memory. Where the file may be written, it alone is read. Each of these is said once, in one line: in the line that
 *   announces tuning (`whereTuningIsKept`), or else when a tuner first
 *   stores a winner — a run that finds its winners says nothing.
 *
 * @module
 */

/** halfstep's version (deno.json's): the cache file of another version is not read. */
export const HALFSTEP_VERSION = "0.1.0";

/** The small interface the tuners use (Web Storage's, as `localStorage` offers it). */
export interface TuningStore {
  /** The value stored under `key`, or null. */
  getItem(key: string): string | null;
  /** Stores `value` under `key` (never throws: a store that cannot write keeps it in memory). */
  setItem(key: string, value: string): void;
  /** Forgets `key`. */
  removeItem(key: string): void;
  /** Every key stored. */
  keys(): string[];
  /** Where the entries live, for messages: a file's path, "localStorage" or "memory". */
  readonly where: string;
  /**
   * Where the next winners will be kept, in one true sentence checked now
   * (a file store reads its file and tries its folder), for the line that
   * announces tuning; the store then does not say it again on its own.
   */
  explain?(): string;
}

/**
 * What names an adapter in the cache besides its name: the vendor, device
 * and architecture WebGPU reports (it tells nothing of the driver's version;
 * on Mesa the name carries the LLVM version).
 */
export function adapterIdentity(
  info: { vendor: string; device: string; architecture: string },
): string {
  const ids = [info.vendor, info.device, info.architecture].filter(Boolean).join("/");
  return ids ? ` (${ids})` : "";
}

/** The parts of Deno's API this file uses (typed here so that browsers need no Deno types). */
interface DenoApi {
  build: { os: string };
  env: { get(name: string): string | undefined };
  permissions: {
    querySync(d: { name: "env"; variable: string } | { name: "read" | "write"; path: string }): {
      state: string;
    };
  };
  readTextFileSync(path: string): string;
  writeTextFileSync(path: string, text: string): void;
  renameSync(from: string, to: string): void;
  removeSync(path: string): void;
  mkdirSync(path: string, options: { recursive: boolean }): void;
  openSync(
    path: string,
    options: { read: boolean; write: boolean; create: boolean },
  ): { lockSync(exclusive: boolean): void; close(): void };
  errors: { NotFound: new (...args: never[]) => Error };
}

/**
 * A store's notes: the first said once per process (a run that tunes may
 * store many winners), and not what `explain` already returned.
 */
function notes(): { say(text: string): void; explained(text: string): string } {
  const said = new Set<string>();
  let first = true;
  return {
    say(text) {
      if (said.has(text) || !first) return;
      first = false;
      said.add(text);
      console.warn(`halfstep: ${text}`);
    },
    explained(text) {
      said.add(text); // a different note later is news, and said
      return text;
    },
  };
}

/** A store in memory, for this run only; `note` is said when the first winner is stored. */
function memoryStore(where: string, note: string | null): TuningStore {
  const entries = new Map<string, string>();
  const say = notes();
  return {
    where,
    explain: () => say.explained(note ?? "tuning results are kept in memory, for this run"),
    getItem: (key) => entries.get(key) ?? null,
    setItem(key, value) {
      if (note) say.say(note);
      entries.set(key, value);
    },
    removeItem: (key) => void entries.delete(key),
    keys: () => [...entries.keys()],
  };
}

/** `localStorage` as a store (a browser's, or Deno's per-script one), or null where there is none. */
function webStorage(note: string | null): TuningStore | null {
  let storage: Storage;
  try {
    if (typeof localStorage === "undefined") return null;
    storage = localStorage;
  } catch {
    return null; // a browser that forbids it (privacy settings, an opaque origin)
  }
  const say = notes();
  const fallback = memoryStore("memory", null);
  return {
    where: "localStorage",
    explain: () => say.explained(note ?? "tuning results are kept in localStorage"),
    getItem: (key) => {
      try {
        return storage.getItem(key) ?? fallback.getItem(key);
      } catch {
        return fallback.getItem(key);
      }
    },
    setItem(key, value) {
      try {
        storage.setItem(key, value);
        if (note) say.say(note);
      } catch (e) {
        say.say(`cannot store tuning results in localStorage (${message(e)}); kept in memory`);
        fallback.setItem(key, value);
      }
    },
    removeItem: (key) => {
      fallback.removeItem(key);
      try {
        storage.removeItem(key);
      } catch { /* nothing stored there */ }
    },
    keys: () => {
      try {
        const stored = Array.from({ length: storage.length }, (_, i) => storage.key(i) ?? "");
        return [...new Set([...stored, ...fallback.keys()])];
      } catch {
        return fallback.keys();
      }
    },
  };
}

/** An error's message, for one line. */
function message(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split("\n")[0].slice(0, 160);
}

/** An environment variable where reading it needs no prompt, else undefined. */
function envVar(deno: DenoApi, name: string): string | undefined {
  const state = deno.permissions.querySync({ name: "env", variable: name }).state;
  return state === "granted" ? deno.env.get(name) || undefined : undefined;
}

/** The cache folder the environment names, or null when it cannot be told without a prompt. */
function tuningCacheDir(
  deno: DenoApi = (globalThis as { Deno?: DenoApi }).Deno!,
): string | null {
  const own = envVar(deno, "HALFSTEP_CACHE_DIR");
  if (own) return own;
  const windows = deno.build.os === "windows";
  const base = windows ? envVar(deno, "LOCALAPPDATA") : envVar(deno, "XDG_CACHE_HOME");
  if (base) return `${base}/halfstep`;
  const home = windows ? envVar(deno, "USERPROFILE") : envVar(deno, "HOME");
  return home ? `${home}/.cache/halfstep` : null;
}

/**
 * The cache file in `dir`. It is read once (then held in memory) and
 * rewritten with every stored winner, merged with what it holds then.
 * `fallback` takes the writes when the file may not be written.
 */
function fileStore(
  deno: DenoApi,
  dir: string,
  writable: boolean,
  fallback: TuningStore,
): TuningStore {
  const path = `${dir}/tuning-${HALFSTEP_VERSION}.json`;
  const say = notes();
  let broken = false; // damaged or unreadable: left alone, the run tunes in memory
  let problem: string | null = null; // why it is broken, as said
  const memory = new Map<string, string>();
  const read = (): Record<string, string> => {
    let text: string;
    try {
      text = deno.readTextFileSync(path);
    } catch (e) {
      if (e instanceof deno.errors.NotFound) return {};
      broken = true;
      problem = `cannot read the tuning cache ${path} (${message(e)}); tuning in memory this run`;
      return {};
    }
    try {
      const parsed = JSON.parse(text);
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw 0;
      const strings = Object.entries(parsed).filter(([, v]) => typeof v === "string");
      return Object.fromEntries(strings) as Record<string, string>;
    } catch {
      broken = true;
      problem = `the tuning cache ${path} is damaged (not a JSON object); tuning in memory ` +
        "this run (delete the file to start a fresh cache)";
      return {};
    }
  };
  let loaded: Record<string, string> | null = null;
  const entries = () => (loaded ??= read());
  /** Writes `text` to a new temporary file, then renames it to `to` (false: it said why not). */
  const writeAtomically = (text: string, to: string | null): boolean => {
    const temp = `${path}.tmp-${crypto.randomUUID()}`;
    try {
      deno.mkdirSync(dir, { recursive: true });
      deno.writeTextFileSync(temp, text);
      if (to) deno.renameSync(temp, to);
      else deno.removeSync(temp);
      return true;
    } catch (e) {
      try {
        deno.removeSync(temp);
      } catch { /* never created */ }
      broken = true;
      problem = `cannot write the tuning cache ${path} (${message(e)}); tuning results kept ` +
        "in memory";
      return false;
    }
  };
  /**
   * An exclusive OS lock on `${path}.lock` while `fn` runs, so that two
   * processes storing at once (the parallel test suite, two scripts) read,
   * change and write the file one after the other, each keeping the other's
   * entries; where no lock can be taken (a read-only folder) `fn` runs
   * without one, and its write fails and says so.
   */
  const locked = (fn: () => void) => {
    let file: { close(): void } | null = null;
    try {
      deno.mkdirSync(dir, { recursive: true });
      const opened = deno.openSync(`${path}.lock`, { read: true, write: true, create: true });
      file = opened;
      opened.lockSync(true); // waits for the other process's write
    } catch { /* no lock here: the write below says what went wrong */ }
    try {
      fn();
    } finally {
      file?.close(); // closing drops the lock
    }
  };
  const write = (change: (all: Record<string, string>) => void) =>
    locked(() => {
      const all = read(); // what other processes stored meanwhile is kept
      if (broken) return; // damaged since: left alone
      change(all);
      if (writeAtomically(JSON.stringify(all, null, 1), path)) loaded = all;
    });
  return {
    where: path,
    explain() {
      if (!writable) return fallback.explain?.() ?? `tuning results are kept in ${fallback.where}`;
      entries();
      if (!broken) writeAtomically("", null); // the folder takes a new file
      return say.explained(
        problem ?? `tuning results are kept in ${path}; every later script starts with them`,
      );
    },
    // Where the file may be written it is the one store: picks this script once kept in
    // localStorage (run without --allow-write) are not read, so what a run finds does not
    // depend on which script path ran before (a cold cache is cold).
    getItem: (key) =>
      memory.get(key) ?? entries()[key] ?? (writable ? null : fallback.getItem(key)),
    setItem(key, value) {
      if (entries()[key] === value && !broken) return; // a run that found its winners writes nothing
      if (!writable) return fallback.setItem(key, value);
      if (!broken) write((all) => void (all[key] = value));
      if (broken) {
        say.say(problem!); // said when it matters: a winner that cannot be kept there
        memory.set(key, value);
      }
    },
    removeItem(key) {
      memory.delete(key);
      fallback.removeItem(key);
      if (writable && !broken && key in entries()) write((all) => void delete all[key]);
    },
    keys: () => [
      ...new Set([
        ...memory.keys(),
        ...Object.keys(entries()),
        ...(writable ? [] : fallback.keys()),
      ]),
    ],
  };
}

/** The store for this runtime and its permissions (see the module's description). */
function chooseStore(): TuningStore {
  const deno = (globalThis as { Deno?: DenoApi }).Deno;
  if (!deno?.permissions?.querySync) {
    return webStorage(null) ?? memoryStore("memory", "no localStorage here: tuning in memory");
  }
  const dir = tuningCacheDir(deno);
  const granted = (name: "read" | "write") =>
    dir !== null && deno.permissions.querySync({ name, path: dir }).state === "granted";
  const readable = granted("read"), writable = readable && granted("write");
  const why = dir === null
    ? "--allow-env (HOME, XDG_CACHE_HOME or HALFSTEP_CACHE_DIR) to find the per-user tuning cache"
    : `--allow-read and --allow-write for the per-user tuning cache ${dir}`;
  const note = `${why} would share tuning results between scripts; kept`;
  const fallback = webStorage(`${note} for this script only (localStorage)`) ??
    memoryStore("memory", `${note} in memory this run`);
  return readable ? fileStore(deno, dir!, writable, fallback) : fallback;
}

let current: TuningStore | null = null;

/**
 * The store the tuners keep their winners in (chosen on first use, from the
 * runtime, the environment and the permissions).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { tuningStore } from "./store.ts";
 * const store = tuningStore();
 * assert.equal(typeof store.where, "string"); // a file's path, "localStorage" or "memory"
 * ```
 */
export function tuningStore(): TuningStore {
  return current ??= chooseStore();
}

/**
 * Where tuning results will be kept, in one true sentence (checked now:
 * see {@link TuningStore.explain}), for the line that announces tuning.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { setTuningStore, whereTuningIsKept } from "./store.ts";
 * const before = setTuningStore({
 *   where: "memory",
 *   getItem: () => null,
 *   setItem() {},
 *   removeItem() {},
 *   keys: () => [],
 * });
 * assert.equal(whereTuningIsKept(), "tuning results are kept in memory");
 * setTuningStore(before);
 * ```
 */
export function whereTuningIsKept(): string {
  const store = tuningStore();
  return store.explain?.() ?? `tuning results are kept in ${store.where}`;
}

/**
 * Uses `store` from now on (tests; null chooses again from the environment).
 * Returns the store used before.
 */
export function setTuningStore(store: TuningStore | null): TuningStore | null {
  const before = current;
  current = store;
  return before;
}
