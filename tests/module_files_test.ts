import assert from "node:assert/strict";
import { Tensor } from "../gpu/mod.ts";
import { BatchNorm, LayerNorm, Linear, ReLU, Sequential } from "../nn/mod.ts";
import { loadModule, saveModule } from "../nn/safetensors_file.ts";
import { GPU_TEST } from "./_gpu.ts";

function model(seed: number) {
  return new Sequential(
    new Linear(6, 5, { seed }),
    new BatchNorm(5),
    new ReLU(),
    new LayerNorm(5),
    new Linear(5, 3, { seed: seed + 1, dtype: "f16" }),
  );
}

async function snapshot(m: Sequential): Promise<Map<string, Float32Array>> {
  const out = new Map<string, Float32Array>();
  for (const [name, t] of m.stateDict()) out.set(name, await t.read());
  return out;
}

Deno.test({
  name:
    "saveModule/loadModule: a model with f32, f16 and BatchNorm buffers round-trips bit-exactly",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const a = model(1);
    // Move BatchNorm's running statistics off their initial values first.
    const x = Tensor.from(Float32Array.from({ length: 24 }, (_, i) => Math.sin(i)), [4, 6]);
    a.layers[1].forward(a.layers[0].forward(x)).dispose();
    await saveModule(`${dir}/m.safetensors`, a, { note: "test" });
    const b = model(7);
    assert.deepEqual(await loadModule(`${dir}/m.safetensors`, b), { note: "test" });
    assert.deepEqual(await snapshot(b), await snapshot(a));
    assert.deepEqual(
      [...b.stateDict().keys()].sort(),
      [
        "0.bias",
        "0.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.weight",
        "3.bias",
        "3.weight",
        "4.bias",
        "4.weight",
      ],
    );
    await Deno.remove(dir, { recursive: true });
  },
});

Deno.test({
  name:
    "loadModule: truncated files and wrong shapes are clear errors that leave the model unchanged",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/m.safetensors`;
    await saveModule(path, model(1));
    const target = model(2);
    const before = await snapshot(target);
    const bytes = await Deno.readFile(path);
    await Deno.writeFile(`${dir}/cut.safetensors`, bytes.subarray(0, bytes.length - 10));
    await assert.rejects(
      loadModule(`${dir}/cut.safetensors`, target),
      /cut\.safetensors" is not a valid safetensors file/,
    );
    const wider = new Sequential(
      new Linear(6, 5, { seed: 1 }),
      new BatchNorm(5),
      new ReLU(),
      new LayerNorm(5),
      new Linear(5, 4, { seed: 2, dtype: "f16" }),
    );
    await saveModule(`${dir}/wider.safetensors`, wider);
    await assert.rejects(
      loadModule(`${dir}/wider.safetensors`, target),
      /4\.weight: expected f16 \[3, 5\], got f16 \[4, 5\][\s\S]*4\.bias: expected f16 \[3\], got f16 \[4\]/,
    );
    assert.deepEqual(await snapshot(target), before, "nothing was written");
    await Deno.remove(dir, { recursive: true });
  },
});
