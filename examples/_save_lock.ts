/**
 * One writer per `--save` path: a run holds `${path}.lock` (created with
 * `createNew`, so two runs cannot both make it) holding its pid and host. A
 * second run is refused with the first one's pid; a lock whose process is
 * gone (killed with SIGKILL, the machine rebooted) is taken over with a note.
 * The lock goes away on a normal exit, on `Deno.exit` and on SIGINT/SIGTERM.
 *
 * @module
 */
import { UsageError } from "./_cli.ts";

/** What a lock file holds. */
interface LockOwner {
  pid: number;
  host: string;
}

/**
 * Whether process `pid` on this machine still runs: /proc on Linux (Deno
 * lets only -A read it), else `kill -0` (needs --allow-run); when neither
 * can tell, it counts as running (the lock is kept, not shared).
 */
function alive(pid: number): boolean {
  if (!Number.isSafeInteger(pid) || pid <= 0) return false;
  if (Deno.build.os === "linux") {
    try {
      Deno.statSync(`/proc/${pid}`);
      return true;
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) return false;
    }
  }
  return signalZero(pid);
}

/** `kill(pid, 0)` by way of the `kill` command: true unless the process is gone. */
function signalZero(pid: number): boolean {
  try {
    return new Deno.Command("kill", { args: ["-0", String(pid)], stderr: "null" }).outputSync()
      .success;
  } catch {
    return true; // cannot tell: keep the lock rather than share the file
  }
}

/** This machine's name where the permissions tell it without a prompt, else "". */
function hostname(): string {
  const sys = Deno.permissions.querySync({ name: "sys", kind: "hostname" }).state === "granted";
  return sys ? Deno.hostname() : Deno.env.get("HOSTNAME") ?? "";
}

function readOwner(lockPath: string): LockOwner | null {
  try {
    const owner = JSON.parse(Deno.readTextFileSync(lockPath));
    return typeof owner?.pid === "number" ? owner : null;
  } catch {
    return null; // empty (its writer was killed between create and write) or not ours
  }
}

/** The lock of one output path, held by this process until {@link SaveLock.release}. */
export class SaveLock {
  #released = false;
  #unlisten: () => void;

  private constructor(readonly lockPath: string) {
    const onExit = () => this.release();
    const onSignal = (signal: Deno.Signal) => () => {
      this.release();
      Deno.exit(signal === "SIGINT" ? 130 : 143);
    };
    const signals: [Deno.Signal, () => void][] = Deno.build.os === "windows"
      ? [["SIGINT", onSignal("SIGINT")]]
      : [["SIGINT", onSignal("SIGINT")], ["SIGTERM", onSignal("SIGTERM")]];
    globalThis.addEventListener("unload", onExit);
    for (const [signal, handler] of signals) Deno.addSignalListener(signal, handler);
    this.#unlisten = () => {
      globalThis.removeEventListener("unload", onExit);
      for (const [signal, handler] of signals) Deno.removeSignalListener(signal, handler);
    };
  }

  /**
   * Takes `${path}.lock` for this process. Throws a UsageError naming the
   * other process when a live one holds it; takes over a stale lock and calls
   * `note` with what it did.
   */
  static acquire(path: string, flag: string, note: (text: string) => void): SaveLock {
    const lockPath = `${path}.lock`;
    const me: LockOwner = { pid: Deno.pid, host: hostname() };
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        Deno.writeTextFileSync(lockPath, JSON.stringify(me), { createNew: true });
        return new SaveLock(lockPath);
      } catch (e) {
        if (!(e instanceof Deno.errors.AlreadyExists)) {
          const why = e instanceof Error ? e.message : String(e);
          throw new UsageError(`--${flag} ${path}: cannot create ${lockPath} (${why}).`, {
            cause: e,
          });
        }
      }
      const owner = readOwner(lockPath);
      const otherHost = owner !== null && owner.host !== "" && me.host !== "" &&
        owner.host !== me.host;
      if (owner !== null && (otherHost || alive(owner.pid))) {
        throw new UsageError(
          `--${flag} ${path} is in use by another run (pid ${owner.pid}` +
            `${otherHost ? ` on ${owner.host}` : ""}); wait for it, or give another path ` +
            `(remove ${lockPath} if that run is gone).`,
        );
      }
      note(
        `taking over ${lockPath}: ${
          owner ? `its process (pid ${owner.pid}) is gone` : "unreadable"
        }`,
      );
      Deno.removeSync(lockPath);
    }
    throw new UsageError(`--${flag} ${path}: another run took ${lockPath} at the same moment.`);
  }

  /** Removes the lock file (once; later calls do nothing). */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.#unlisten();
    try {
      Deno.removeSync(this.lockPath);
    } catch {
      // already gone: nothing to release
    }
  }
}
