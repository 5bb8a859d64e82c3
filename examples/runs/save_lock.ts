/**
 * One writer per `--save` path: a run holds an exclusive OS lock on
 * `${path}.lock` (beside the file a symbolic link names), a file that names
 * it (pid and host). A second run is
 * refused with the first one's pid. The OS drops the lock when its process
 * dies however it dies (SIGKILL included), so a lock file left by a killed
 * run is simply taken over, with a note; no process table is read (Deno lets
 * only -A read /proc). The file goes away on a normal exit, on `Deno.exit`
 * and on SIGINT/SIGTERM, where the run ends with a line saying what the file
 * holds (what the script last told {@link SaveLock.hold}) and that `--resume`
 * continues it.
 *
 * @module
 */
import { linkTarget } from "../../files.ts";
import { reason, UsageError } from "../cli/flags.ts";

/** This machine's name where the permissions tell it without a prompt, else "". */
function hostname(): string {
  const sys = Deno.permissions.querySync({ name: "sys", kind: "hostname" }).state === "granted";
  return sys ? Deno.hostname() : Deno.env.get("HOSTNAME") ?? "";
}

/** "pid 123 on host" from a lock file's text, or "" when it names nobody. */
function ownerOf(text: string): string {
  try {
    const { pid, host } = JSON.parse(text);
    return typeof pid === "number" ? `pid ${pid}${host ? ` on ${host}` : ""}` : "";
  } catch {
    return ""; // empty (its writer died between lock and write) or not ours
  }
}

/** Whether `path` still names the open `file` (not removed or replaced since it was opened). */
function sameFile(file: Deno.FsFile, path: string): boolean {
  try {
    return file.statSync().ino === Deno.statSync(path).ino;
  } catch {
    return false;
  }
}

/** The lock of one output path, held by this process until {@link SaveLock.release}. */
export class SaveLock {
  #file: Deno.FsFile;
  #released = false;
  #unlisten: () => void;

  #holds: string | null = null;

  private constructor(
    readonly lockPath: string,
    file: Deno.FsFile,
    readonly path: string,
    readonly note: (text: string) => void,
  ) {
    this.#file = file;
    const onExit = () => this.release();
    const onSignal = (code: number) => () => {
      this.note(this.#farewell());
      this.release();
      Deno.exit(code);
    };
    const signals: [Deno.Signal, () => void][] = [["SIGINT", onSignal(130)]];
    if (Deno.build.os !== "windows") signals.push(["SIGTERM", onSignal(143)]);
    globalThis.addEventListener("unload", onExit);
    for (const [signal, handler] of signals) Deno.addSignalListener(signal, handler);
    this.#unlisten = () => {
      globalThis.removeEventListener("unload", onExit);
      for (const [signal, handler] of signals) Deno.removeSignalListener(signal, handler);
    };
  }

  /**
   * Takes `${path}.lock` (the path of `--flag`; beside the file a symbolic
   * link names, so a run saving through the link and one saving to the file
   * itself take the same lock) for this process. Throws a UsageError naming
   * the other process while a live one holds it; takes over a file a dead
   * run left and calls `note` with what it did (and, if the run is
   * interrupted, with what the file holds).
   */
  static async acquire(
    path: string,
    flag: string,
    note: (text: string) => void,
  ): Promise<SaveLock> {
    const lockPath = `${await linkTarget(path)}.lock`;
    for (let attempt = 0; attempt < 3; attempt++) {
      let file: Deno.FsFile;
      try {
        file = Deno.openSync(lockPath, { read: true, write: true, create: true });
      } catch (e) {
        throw new UsageError(`--${flag} ${path}: cannot create ${lockPath} (${reason(e)}).`, {
          cause: e,
        });
      }
      const previous = new TextDecoder().decode(Deno.readFileSync(lockPath));
      if (!file.tryLockSync(true)) {
        file.close();
        const owner = ownerOf(previous) || "its pid unknown";
        throw new UsageError(
          `--${flag} ${path} is in use by another run (${owner}); wait for it or give another path.`,
        );
      }
      // The holder before us may have removed the file between our open and our lock.
      if (!sameFile(file, lockPath)) {
        file.close();
        continue;
      }
      if (ownerOf(previous)) note(`taking over ${lockPath}: ${ownerOf(previous)} is gone`);
      const me = JSON.stringify({ pid: Deno.pid, host: hostname() });
      file.truncateSync(0);
      file.writeSync(new TextEncoder().encode(me));
      return new SaveLock(lockPath, file, path, note);
    }
    throw new UsageError(`--${flag} ${path}: ${lockPath} keeps changing hands; try again.`);
  }

  /** Records what the file holds now ("epoch 2 (step 936)"), after a save or a resume. */
  hold(what: string): void {
    this.#holds = what;
  }

  /** The line an interrupted run ends with: what the file holds, and how to go on. */
  #farewell(): string {
    return this.#holds === null
      ? `interrupted before the first save: nothing was written to ${this.path}.`
      : `interrupted; ${this.path} holds ${this.#holds}: add --resume ${this.path} to continue ` +
        "from there.";
  }

  /** Removes the lock file and drops the lock (once; later calls do nothing). */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.#unlisten();
    try {
      Deno.removeSync(this.lockPath);
    } catch {
      // already gone: nothing to remove
    }
    this.#file.close(); // closing drops the OS lock
  }
}
