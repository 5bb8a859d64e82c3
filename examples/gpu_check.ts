/**
 * The one command for a lent GPU: everything a GPU run should show for the
 * tensor-core path, within a time budget (8 minutes by default), as one JSON
 * object per line on stdout (and in `--out FILE`), each written as soon as it
 * is known, so a run cut short keeps what finished.
 *
 *     deno run -A --v8-flags=--expose-gc examples/gpu_check.ts [--budget 480] [--size auto] [--out FILE]
 *
 * On a lent machine (no registry; `HALFSTEP_DAWN_NODE` from the packed tools):
 *
 *     source .gpu/env.sh && deno run --no-lock --node-modules-dir=none -A \
 *       --v8-flags=--expose-gc examples/gpu_check.ts --out $OUT/gpu_check.jsonl
 *
 * Dawn first, then Deno's own WebGPU, each in a process of its own (a crash
 * costs only the rest of its backend), running the parts of
 * examples/bench/gpu_check_parts.ts in order: `adapter` (both), `correct` (every
 * subgroup-matrix candidate against f64 at three shapes: Dawn), `matmul`
 * (f16 at 4096³ in each orientation, SIMT against subgroup-matrix tilings,
 * TFLOP/s) and `gpt` (the nanoGPT-size GPT step in f32 and AMP, with the
 * tuner's picks and the top kernels). Each part has a share of the budget
 * ({@link SHARES}): it may use what the earlier parts left and half the shares
 * of the later ones of its backend, starts no new work past that, and its
 * backend's process is ended 15 s after the backend's shares. Lines the driver adds: `{"part": "...", "status": "done" | "out of
 * time" | "failed" | "unavailable", "seconds": ...}` per part, and a summary.
 * Exit status 0 when every part ran to the end or was unavailable, 1 otherwise.
 */
import { parseFlags } from "./cli/flags.ts";
import { type Part, PARTS, runPart } from "./bench/gpu_check_parts.ts";
import type { Backend } from "../gpu/mod.ts";

/** Each part's share of the budget on each backend (Dawn's parts first: they are the new ones). */
export const SHARES: readonly { backend: Backend; part: Part; share: number }[] = [
  { backend: "dawn", part: "adapter", share: 0.03 },
  { backend: "dawn", part: "correct", share: 0.22 },
  { backend: "dawn", part: "matmul", share: 0.15 },
  { backend: "dawn", part: "gpt", share: 0.25 },
  { backend: "builtin", part: "adapter", share: 0.02 },
  { backend: "builtin", part: "matmul", share: 0.1 },
  { backend: "builtin", part: "gpt", share: 0.23 },
];

/** Seconds a backend's process may run past its share before it is ended. */
const GRACE_SECONDS = 15;

const HELP = `Usage: deno run -A --v8-flags=--expose-gc examples/gpu_check.ts [options]

The tensor-core check for a lent GPU: the adapters of both backends, every
subgroup-matrix candidate against f64, matmul TFLOP/s (SIMT against subgroup
matrices) and the GPT step, as JSON lines on stdout (see docs/tensor_cores.md).

  --budget SECONDS  time for the whole run (default 480); each part gets its share
  --size SIZE       auto (real on GPUs, small on CPU adapters), real or small
  --out FILE        also append every line to FILE
  -h, --help        show this help`;

/** One line of a child's stdout, parsed, or null for a line that is not a JSON object. */
function parsed(line: string): Record<string, unknown> | null {
  try {
    const value = JSON.parse(line);
    return typeof value === "object" && value !== null ? value : null;
  } catch {
    return null;
  }
}

/**
 * The flags a child needs where no registry is: with `HALFSTEP_DAWN_NODE`
 * (Dawn from a file, as on a lent machine) the child reads no lock file and no
 * node_modules, as the driver was started; elsewhere it runs as the checkout
 * is set up (Dawn from node_modules).
 */
function offlineFlags(): string[] {
  return Deno.env.get("HALFSTEP_DAWN_NODE") ? ["--no-lock", "--node-modules-dir=none"] : [];
}

/** Runs the parts of one backend in a child process, forwarding its lines; what became of each part. */
async function runBackend(
  backend: Backend,
  parts: { part: Part; seconds: number }[],
  size: string,
  write: (line: string) => void,
): Promise<Map<Part, { status: string; seconds: number }>> {
  const started = performance.now();
  const total = parts.reduce((s, p) => s + p.seconds, 0);
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...offlineFlags(),
      "-A",
      "--v8-flags=--expose-gc",
      new URL(import.meta.url).pathname,
      "--child",
      backend,
      "--size",
      size,
      "--plan",
      JSON.stringify(parts),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const timer = setTimeout(() => child.kill("SIGKILL"), (total + GRACE_SECONDS) * 1000);
  const outcome = new Map<Part, { status: string; seconds: number }>();
  let current: Part | null = null, partStart = started;
  const decoder = new TextDecoderStream();
  let pending = "";
  for await (const chunk of child.stdout.pipeThrough(decoder)) {
    pending += chunk;
    let newline;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      const value = parsed(line);
      if (!value) continue;
      if (value.marker === "start") {
        current = value.part as Part;
        partStart = performance.now();
        continue;
      }
      if (value.marker === "end") {
        outcome.set(value.part as Part, {
          status: value.status as string,
          seconds: (performance.now() - partStart) / 1000,
        });
        current = null;
        continue;
      }
      write(line);
    }
  }
  const status = await child.status;
  clearTimeout(timer);
  if (current) {
    const killed = status.signal === "SIGKILL";
    outcome.set(current, {
      status: killed ? "out of time" : "failed",
      seconds: (performance.now() - partStart) / 1000,
    });
  }
  return outcome;
}

/** The driver: both backends, their parts, the summary (see the module comment). */
async function main(): Promise<number> {
  const { values } = parseFlags({
    args: Deno.args,
    options: {
      budget: { type: "string", default: "480" },
      size: { type: "string", default: "auto" },
      out: { type: "string" },
      child: { type: "string" },
      plan: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  const size = values.size as "auto" | "real" | "small";
  if (!["auto", "real", "small"].includes(size)) {
    console.error(`gpu_check: --size must be auto, real or small, not "${size}"`);
    return 2;
  }
  if (values.child) return await child(values.child as Backend, size, values.plan ?? "[]");
  const budget = Number(values.budget);
  if (!(budget > 0)) {
    console.error(`gpu_check: --budget must be a number of seconds > 0, not "${values.budget}"`);
    return 2;
  }
  const out = values.out ? await Deno.open(values.out, { append: true, create: true }) : null;
  const encoder = new TextEncoder();
  const write = (line: string) => {
    console.log(line);
    out?.writeSync(encoder.encode(line + "\n"));
  };
  const started = performance.now();
  const statuses: Record<string, string> = {};
  let planned = 0;
  for (const backend of ["dawn", "builtin"] as const) {
    const parts = SHARES.filter((s) => s.backend === backend).map((s) => ({
      part: s.part,
      seconds: s.share * budget,
    }));
    // What the earlier backend left unused passes to this one's first part.
    parts[0].seconds += Math.max(0, planned - (performance.now() - started) / 1000);
    planned += parts.reduce((sum, p) => sum + p.seconds, 0);
    console.error(
      `gpu_check: ${backend}: ${
        parts.map((p) => `${p.part} ${p.seconds.toFixed(0)} s`).join(", ")
      }`,
    );
    const outcome = await runBackend(backend, parts, size, write);
    for (const { part } of parts) {
      const o = outcome.get(part) ?? { status: "not started", seconds: 0 };
      statuses[`${backend} ${part}`] = o.status;
      write(JSON.stringify({ check: "gpu", part, backend, status: o.status, seconds: o.seconds }));
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const ok = Object.values(statuses).every((s) => s === "done" || s === "unavailable");
  write(JSON.stringify({ check: "gpu", part: "summary", budget, seconds, statuses, ok }));
  out?.close();
  return ok ? 0 : 1;
}

/**
 * One backend's process: its parts in order, each until its deadline, with
 * markers the driver reads (`{"marker": "start" | "end", ...}`). A backend
 * that cannot start (no Dawn, no adapter) makes every part "unavailable".
 */
async function child(
  backend: Backend,
  size: "auto" | "real" | "small",
  plan: string,
): Promise<number> {
  const parts = JSON.parse(plan) as { part: Part; seconds: number }[];
  const started = performance.now();
  let available = true;
  for (const [n, { part }] of parts.entries()) {
    if (!PARTS.includes(part)) throw new Error(`gpu_check: no part ${part}`);
    console.log(JSON.stringify({ marker: "start", part }));
    let status = "done";
    // A part may use what the earlier ones left, and half the shares of those after it.
    const seconds = (i: number) => parts[i].seconds;
    const until = parts.reduce((sum, _, i) => sum + (i <= n ? seconds(i) : seconds(i) / 2), 0);
    const deadline = started + until * 1000;
    if (!available) status = "unavailable";
    else {
      try {
        await runPart(part, { backend, size, deadline });
      } catch (e) {
        const message = (e as Error).message.split("\n")[0].slice(0, 300);
        // The first part starts the device: a backend that cannot is unavailable here.
        status = part === "adapter" ? "unavailable" : "failed";
        available = part !== "adapter";
        console.log(JSON.stringify({ check: "gpu", part, backend, status, error: message }));
      }
    }
    if (status === "done" && performance.now() > deadline) status = "out of time";
    console.log(JSON.stringify({ marker: "end", part, status }));
  }
  return 0;
}

if (import.meta.main) Deno.exit(await main());
