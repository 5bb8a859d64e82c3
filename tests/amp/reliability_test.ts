/**
 * Failures stay where they happen: a bad dtype string is caught at the API,
 * a kernel that fails to compile breaks only its op, reductions of nothing
 * follow PyTorch, over-allocation is a clear error, a file with NaN weights
 * does not load silently, and saves interrupted at any point leave the
 * previous file whole and no temporaries behind.
 */
import assert from "node:assert/strict";
import {
  Adam,
  add,
  cast,
  crossEntropy,
  DTypeError,
  GpuError,
  initGpu,
  Linear,
  max,
  mean,
  noGrad,
  ShapeError,
  sum,
  Tensor,
  tidy,
  ValueError,
} from "../../mod.ts";
import { defineKernel, type DType } from "../../gpu/mod.ts";
import {
  loadModule,
  loadTrainingState,
  saveModule,
  saveSafetensors,
  saveTrainingState,
} from "../../files.ts";
import { gpu, GPU_TEST } from "../helpers/gpu.ts";

Deno.test({
  name: "reliability: a bad dtype string is an error at the API, and the device stays usable",
  ...GPU_TEST,
  async fn() {
    const bad = "f64" as DType;
    assert.throws(() => Tensor.from([1, 2], [2], { dtype: bad }), DTypeError);
    assert.throws(() => Tensor.zeros([2], { dtype: "f8" as DType }), /dtype "f8" is not/);
    assert.throws(() => Tensor.empty([2], bad), DTypeError);
    const x = Tensor.from([1, 2], [2]);
    assert.throws(() => cast(x, "f64" as DType), /cast: dtype "f64" is not supported/);
    assert.deepEqual(Array.from(await tidy(() => add(x, x)).read()), [2, 4]);
    x.dispose();
  },
});

Deno.test({
  name: "reliability: a kernel that fails to compile is an error of its own op; the device lives",
  ...GPU_TEST,
  async fn() {
    const broken = defineKernel({
      name: "broken_on_purpose",
      bindings: (_: Record<string, never>) => [{ name: "x", type: "f32", write: true }],
      uniforms: { n: "u32" },
      source: () => "@compute @workgroup_size(1) fn main() { x[0] = no_such_name; }",
    });
    const x = Tensor.from([1, 2], [2]);
    gpu.dispatch(gpu.kernel(broken, {}), { x }, { n: 2 }, [1]); // recorded; compiled asynchronously
    await assert.rejects(
      gpu.sync(),
      (e: unknown) =>
        e instanceof GpuError && /kernel broken_on_purpose\{\} failed to compile/.test(e.message) &&
        /no_such_name/.test(e.message),
    );
    // Every other op still works, and the error was reported once.
    assert.deepEqual(Array.from(await tidy(() => add(x, x)).read()), [2, 4]);
    await gpu.sync();
    // Dispatching the broken kernel again fails at once, naming it.
    assert.throws(
      () => gpu.dispatch(gpu.kernel(broken, {}), { x }, { n: 2 }, [1]),
      /broken_on_purpose/,
    );
    x.dispose();
  },
});

Deno.test({
  name: "reliability: reductions of nothing follow PyTorch (mean NaN, sum 0, max an error)",
  ...GPU_TEST,
  async fn() {
    const empty = Tensor.zeros([0, 3]);
    const [m] = await tidy(() => mean(empty)).read();
    assert.ok(Number.isNaN(m), `mean of nothing is NaN, got ${m}`);
    assert.equal(await tidy(() => sum(empty)).item(), 0);
    const perColumn = await tidy(() => mean(empty, { axis: 0 })).read();
    assert.equal(perColumn.length, 3);
    assert.ok(perColumn.every(Number.isNaN));
    assert.equal(tidy(() => mean(empty, { axis: 1 })).size, 0);
    assert.throws(() => noGrad(() => max(empty)), ShapeError);
    const logits = Tensor.zeros([0, 4]);
    const [ce] = await tidy(() => crossEntropy(logits, [])).read();
    assert.ok(Number.isNaN(ce), "the mean cross-entropy of an empty batch is NaN");
    assert.equal(await tidy(() => crossEntropy(logits, [], { reduction: "sum" })).item(), 0);
    empty.dispose();
    logits.dispose();
  },
});

Deno.test({
  name: "reliability: memoryLimitBytes turns over-allocation into a clear error",
  ...GPU_TEST,
  async fn() {
    const limited = await initGpu({
      matmulTiling: "default",
      setDefault: false,
      memoryLimitBytes: 2 ** 20,
    });
    try {
      const big = 300_000; // f32 elements: 1.2 MB, over the 1 MiB limit
      assert.throws(
        () => Tensor.empty([big], "f32", limited),
        (e: unknown) =>
          e instanceof GpuError &&
          /allocating f32 tensor \[300000\] \(\d+ bytes\) would take GPU memory to \d+ bytes, over the limit of 1048576/
            .test(e.message),
      );
      // Cached buffers are given back before an allocation is refused.
      const a = Tensor.empty([150_000], "f32", limited);
      a.dispose();
      const b = Tensor.empty([200_000], "f32", limited);
      assert.ok(limited.memoryStats().reservedBytes <= 2 ** 20);
      b.dispose();
    } finally {
      limited.destroy();
    }
    await assert.rejects(initGpu({ memoryLimitBytes: -1, setDefault: false }), ValueError);
  },
});

Deno.test({
  name: "reliability: a file whose weights hold NaN or Inf does not load silently",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const path = `${dir}/diverged.safetensors`;
      const model = new Linear(3, 2, { seed: 1 });
      const bad = Tensor.from([1, NaN, 3, Infinity, -Infinity, 6], [2, 3]);
      model.weight.copyFrom(bad);
      await saveModule(path, model, { allowNonFinite: true });
      const fresh = new Linear(3, 2, { seed: 2 });
      const before = await fresh.weight.read();
      await assert.rejects(
        loadModule(path, fresh),
        /weight holds 3 non-finite value\(s\) \(NaN or ±Inf\); pass \{ allowNonFinite: true \}/,
      );
      assert.deepEqual(await fresh.weight.read(), before, "nothing was loaded");
      await loadModule(path, fresh, { allowNonFinite: true });
      assert.ok(Number.isNaN((await fresh.weight.read())[1]));
      // A training state: weights, optimizer moments and gradients are all checked first.
      const statePath = `${dir}/run.safetensors`;
      const optimizer = new Adam(model.parameters());
      await saveTrainingState(statePath, { model, optimizer }, { allowNonFinite: true });
      const target = new Linear(3, 2, { seed: 3 }), targetOptimizer = new Adam(target.parameters());
      const untouched = await target.bias!.read();
      await assert.rejects(
        loadTrainingState(statePath, { model: target, optimizer: targetOptimizer }),
        /model\.weight"? holds 3 non-finite value\(s\).*nothing was loaded/,
      );
      assert.deepEqual(await target.bias!.read(), untouched);
      await loadTrainingState(statePath, { model: target, optimizer: targetOptimizer }, {
        allowNonFinite: true,
      });
      for (const t of [model, fresh, bad, target, optimizer, targetOptimizer]) t.dispose();
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/** Files in `dir`, sorted. */
async function listing(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(dir)) names.push(e.name);
  return names.sort();
}

Deno.test({
  name:
    "reliability: saves failing at random points keep the previous file and leave no temporaries",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/run.safetensors`;
    const tensors = {
      a: Tensor.from(new Float32Array(5000).fill(1), [5000]),
      b: Tensor.zeros([7]),
    };
    const write = Deno.FsFile.prototype.write, sync = Deno.FsFile.prototype.sync;
    const rename = Deno.rename;
    try {
      await saveSafetensors(path, tensors);
      const good = await Deno.readFile(path);
      // A killed process leaves its temporary behind; a file that only looks alike stays.
      await Deno.writeFile(`${path}.tmp-${crypto.randomUUID()}`, new Uint8Array(10));
      await Deno.writeFile(`${path}.tmp-keep-me`, new Uint8Array(1));
      // Failing writes after a random number of bytes, a failing fsync, a failing rename.
      let seed = 12345;
      const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
      const faults: (() => void)[] = [];
      for (let i = 0; i < 6; i++) {
        faults.push(() => {
          let budget = Math.floor(random() * good.byteLength);
          Deno.FsFile.prototype.write = function (this: Deno.FsFile, p: Uint8Array) {
            if (budget <= 0) return Promise.reject(new Error("disk full (injected)"));
            const n = Math.min(budget, p.byteLength);
            budget -= n;
            return write.call(this, p.subarray(0, n));
          };
        });
      }
      faults.push(() => (Deno.FsFile.prototype.sync = () => Promise.reject(new Error("EIO"))));
      faults.push(() => (Deno.rename = () => Promise.reject(new Error("EXDEV (injected)"))));
      for (const fault of faults) {
        fault();
        await assert.rejects(
          saveSafetensors(path, tensors),
          /cannot write ".*" \(left unchanged\)/,
        );
        Deno.FsFile.prototype.write = write;
        Deno.FsFile.prototype.sync = sync;
        Deno.rename = rename;
        assert.deepEqual(await Deno.readFile(path), good, "the previous file is whole");
        const temps = (await listing(dir)).filter((n) =>
          n.includes(".tmp-") && n !== "run.safetensors.tmp-keep-me"
        );
        assert.deepEqual(
          temps,
          [],
          "the failed save removed its temporary (and the stale one is gone)",
        );
      }
      await saveSafetensors(path, tensors);
      assert.deepEqual(await listing(dir), ["run.safetensors", "run.safetensors.tmp-keep-me"]);
    } finally {
      Deno.FsFile.prototype.write = write;
      Deno.FsFile.prototype.sync = sync;
      Deno.rename = rename;
      for (const t of Object.values(tensors)) t.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
