/**
 * One GPT-2 124M training step's peak bytes, in a process of its own: the
 * measurement behind `bench.ts gpt2_memory` (which runs this file once per
 * mode) and docs/gpt2.md's memory table.
 *
 *     deno run -A examples/gpt2_memory_step.ts --mode amp+ckpt [--batch 8 --context 512]
 *
 * prints one JSON line and exits as soon as the step is recorded, without
 * waiting for the adapter to run it. That is honest: the buffer pool
 * allocates (and takes back) every buffer as ops are recorded, so its peak
 * is final once `trainer.step` returns, and nothing in a step reads back.
 * It matters on a CPU adapter, where recording waits for execution anyway:
 * lavapipe runs a submitted batch inside `queue.submit` (Deno's wgpu), and
 * under Dawn creating a compute pipeline waits while lavapipe's queue runs.
 * So each step's pipelines are compiled first, by the same step on a
 * one-block GPT-2 at batch 1 (cheap to run), and the 124M step then records
 * in seconds instead of running for tens of minutes.
 *
 * @module
 */
import { initGpu } from "../mod.ts";
import { parseFlags } from "./cli/flags.ts";
import { backendFlag } from "./cli/backend_flag.ts";
import { GPT2_MEMORY_MODES, measureGpt2Step } from "./gpt2/memory_step.ts";

if (import.meta.main) {
  const { values } = parseFlags({
    args: Deno.args,
    options: {
      mode: { type: "string", default: "amp+ckpt" },
      batch: { type: "string", default: "8" },
      context: { type: "string", default: "512" },
      backend: { type: "string" },
    },
  });
  const m = GPT2_MEMORY_MODES.find((x) => x.mode === values.mode);
  if (!m) {
    console.error(
      `gpt2_memory_step: --mode must be one of ${GPT2_MEMORY_MODES.map((x) => x.mode).join(", ")}`,
    );
    Deno.exit(2);
  }
  const gpu = await initGpu({ tuning: "off", backend: backendFlag(values.backend) });
  const result = await measureGpt2Step(gpu, m, Number(values.batch), Number(values.context));
  console.log(JSON.stringify({ ...result, adapter: gpu.adapterName, backend: gpu.backend }));
  Deno.exit(0); // without waiting for the adapter to run the recorded step
}
