/**
 * Running the examples as a user does, in subprocesses: the README's
 * permissions, the exit status and both output streams, the JSON events of a
 * `--json` run, and a run that something happens to once epoch 1 was saved.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ROOT } from "./bundle.ts";

export const MNIST: string = join(ROOT, "examples/mnist.ts");
export const TINY_GPT: string = join(ROOT, "examples/tiny_gpt.ts");
export const GPT2: string = join(ROOT, "examples/gpt2.ts");
/** A quick MNIST run: 8 steps of 128 images. */
export const QUICK: string[] = ["--limit", "1024", "--epochs", "1"];

/** What a finished run left: its exit status and output. */
export interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

const ENV = { DENO_WEBGPU_BACKEND: "vulkan,metal,dx12", NO_COLOR: "1" };

/**
 * What an example needs beyond the README's permissions on the suite's backend: on the Dawn
 * pass (`HALFSTEP_BACKEND=dawn`, which the example inherits and runs on) Dawn's `--allow-ffi`.
 */
export const BACKEND_PERMISSIONS: readonly string[] = Deno.env.get("HALFSTEP_BACKEND") === "dawn"
  ? ["--allow-ffi"]
  : [];

/**
 * Runs a script with the README's permissions (`--allow-write` unless `write`
 * is false); `permissions` replaces them all; `env` adds to its environment.
 */
export async function run(
  script: string,
  args: string[],
  write = true,
  permissions = ["--allow-read", "--allow-env", ...(write ? ["--allow-write"] : [])],
  env: Record<string, string> = {},
): Promise<Run> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...permissions, ...BACKEND_PERMISSIONS, script, ...args],
    env: { ...ENV, ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** The JSON events a `--json` run printed. */
export function events(stdout: string): Record<string, unknown>[] {
  return stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

/**
 * stderr without the adapter's XDG_RUNTIME_DIR warning, Dawn's notes on its
 * limits, and Deno's lines as it fetches an npm package a script imports
 * the first time on this machine (the suite's runs may be the first).
 */
export function errorLines(r: Run): string[] {
  return r.stderr.trim().split("\n").filter((l) =>
    l && !l.includes("XDG_RUNTIME_DIR") && !/^Warning: max\w+ artificially reduced/.test(l) &&
    !/^(Download https:\/\/|Initialize \S+@\S+$)/.test(l)
  );
}

/** Asserts exit status 2 with one line of stderr matching `message`, and nothing trained. */
export function assertRefused(r: Run, message: RegExp, what: string): void {
  assert.equal(r.code, 2, `${what}: exit status (stderr: ${r.stderr})`);
  const lines = errorLines(r);
  assert.equal(lines.length, 1, `${what}: one line, got ${JSON.stringify(lines)}`);
  assert.match(lines[0], message, what);
  assert.equal(r.stdout.trim(), "", `${what}: nothing started`);
}

/** `deno run` arguments for mnist with `args`, the README's permissions and `--allow-write`. */
export function mnistRunArgs(args: string[]): string[] {
  return [
    "run",
    "--allow-read",
    "--allow-env",
    "--allow-write",
    ...BACKEND_PERMISSIONS,
    MNIST,
    ...args,
  ];
}

/**
 * Runs mnist; once epoch 1 has been saved, `then()` says what happens: the
 * process is killed, interrupted (SIGINT, as Ctrl-C), or a path is removed
 * so that the next save fails.
 */
export async function afterFirstSave(
  args: string[],
  then: () => "kill" | "interrupt" | string,
): Promise<Run> {
  const child = new Deno.Command(Deno.execPath(), {
    args: mnistRunArgs(args),
    env: ENV,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  let stdout = "", acted = false;
  for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
    stdout += chunk;
    if (!acted && stdout.includes('"event":"save"')) {
      acted = true;
      const action = then();
      if (action === "kill") child.kill("SIGKILL");
      else if (action === "interrupt") child.kill("SIGINT");
      else await Deno.remove(action, { recursive: true }); // the next save has nowhere to go
    }
  }
  const { code } = await child.status;
  return { code, stdout, stderr: await stderr };
}

/** Runs `fn` with a fresh temporary folder, removed afterwards. */
export async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
