// Peak bytes of one GPT step at real size (memory only; run where timing does not matter).
import { TinyGpt } from "./examples/tiny_gpt_model.ts";
import { gptConfig, syntheticBatch } from "./examples/bench_gpt.ts";
import { AdamW, AmpTrainer, crossEntropy, initGpu } from "./mod.ts";
const gpu = await initGpu({ matmulTiling: "default" });
const g = gptConfig("real");
const { x, y } = syntheticBatch(g);
for (const mode of Deno.args) {
  const model = new TinyGpt({ ...g, fusedAttention: !mode.includes("unfused") });
  const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
  const trainer = new AmpTrainer(model, optimizer, { enabled: mode !== "f32", maxGradNorm: 1 });
  const t0 = performance.now();
  trainer.step(() => crossEntropy(model.forward(x), y)).dispose();
  await gpu.sync();
  gpu.resetPeakMemory();
  trainer.step(() => crossEntropy(model.forward(x), y)).dispose();
  await gpu.sync();
  console.log(JSON.stringify({ mode, peakGiB: gpu.memoryStats().peakBytes / 2 ** 30, seconds: (performance.now() - t0) / 1000 }));
  trainer.dispose(); optimizer.dispose(); model.dispose?.();
}
