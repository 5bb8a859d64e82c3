import assert from "node:assert/strict";
import {
  add,
  type F16Mode,
  GpuError,
  initGpu,
  mul,
  relu,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { unaryKernel } from "../../helpers/internals.ts";
import { kernelKey } from "../../../gpu/device/kernel.ts";
import { sizeClass } from "../../../gpu/device/buffer_pool.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { capturedWarnings } from "../../helpers/warnings.ts";

Deno.test({
  name: "device: the adapter's real limits are requested and f16 is on where the adapter has it",
  ...GPU_TEST,
  fn() {
    assert.ok(gpu.device.limits.maxStorageBufferBindingSize > 128 * 1024 * 1024 - 1);
    assert.ok(gpu.device.limits.maxComputeInvocationsPerWorkgroup >= 256);
    // CI runs lavapipe, which has shader-f16: f16 tests must not be skipped silently.
    assert.equal(gpu.f16, gpu.device.features.has("shader-f16"));
    assert.ok(gpu.f16, `f16 unavailable on ${gpu.adapterName}: the f16 tests would not run`);
  },
});

Deno.test({
  name: "device: f16 'off' refuses f16 tensors clearly; 'require' works where the adapter has it",
  ...GPU_TEST,
  async fn() {
    const off = await initGpu({ f16: "off", matmulTiling: "default", setDefault: false });
    try {
      assert.equal(off.f16, false);
      assert.throws(
        () => Tensor.zeros([2, 3], { dtype: "f16", gpu: off }),
        /cannot create an f16 tensor of shape \[2, 3\]: f16 is off on this device/,
      );
    } finally {
      off.destroy();
    }
    const required = await initGpu({ f16: "require", matmulTiling: "default", setDefault: false });
    assert.equal(required.f16, true);
    required.destroy();
    // An invalid mode (from untyped JavaScript) is a clear error.
    await assert.rejects(
      initGpu({ f16: "maybe" as unknown as F16Mode, setDefault: false }),
      /f16 must be "auto", "require" or "off"/,
    );
  },
});

Deno.test({
  name: "device: a lost device and use after destroy surface as clear errors",
  ...GPU_TEST,
  async fn() {
    const other = await initGpu({ matmulTiling: "default", setDefault: false });
    const t = Tensor.from([1, 2, 3], [3], { gpu: other });
    other.device.destroy(); // what a driver reset looks like to us
    await other.device.lost;
    await new Promise((r) => setTimeout(r, 0));
    assert.throws(() => relu(t), /The GPU device was lost \(destroyed/);
    const third = await initGpu({ matmulTiling: "default", setDefault: false });
    third.destroy();
    assert.throws(() => Tensor.zeros([1], { gpu: third }), /this device was destroyed/);
  },
});

Deno.test({
  name: "memory: allocation beyond the adapter's limits names what was being allocated",
  ...GPU_TEST,
  fn() {
    const limit = gpu.device.limits.maxStorageBufferBindingSize;
    const before = gpu.memoryStats();
    assert.throws(
      () => Tensor.empty([limit / 2 + 1], "f32"),
      (e: Error) =>
        e instanceof GpuError &&
        /^Tensor\.empty: f32 \[\d+\] needs \d+ bytes, over this adapter's max/.test(e.message),
    );
    assert.deepEqual(gpu.memoryStats(), before, "a failed allocation changes no statistics");
  },
});

Deno.test({
  name: "memory: statistics track allocation, peak and the pool's reserve",
  ...GPU_TEST,
  fn() {
    gpu.pool.releaseCached();
    const base = gpu.memoryStats();
    gpu.resetPeakMemory();
    const a = Tensor.empty([1000]); // 4000 bytes -> 4096 class
    const b = Tensor.empty([300], "f16"); // 600 bytes -> 1024 class
    let s = gpu.memoryStats();
    assert.equal(s.allocatedBytes - base.allocatedBytes, 4096 + 1024);
    assert.equal(s.reservedBytes - base.reservedBytes, 4096 + 1024);
    a.dispose();
    s = gpu.memoryStats();
    assert.equal(s.allocatedBytes - base.allocatedBytes, 1024);
    assert.equal(s.peakBytes - base.allocatedBytes, 4096 + 1024);
    assert.equal(s.reservedBytes - base.reservedBytes, 4096 + 1024, "freed buffers stay reserved");
    const c = Tensor.empty([900]); // reuses a's buffer
    assert.equal(gpu.memoryStats().reservedBytes - base.reservedBytes, 4096 + 1024);
    c.dispose();
    b.dispose();
    gpu.pool.releaseCached();
    assert.equal(gpu.memoryStats().reservedBytes, base.reservedBytes);
    assert.equal(sizeClass(1), 256);
    assert.equal(sizeClass((1 << 20) + 1), 2 << 20);
  },
});

Deno.test({
  name: "tensor: upload, read back, dispose and use-after-dispose",
  ...GPU_TEST,
  async fn() {
    const t = Tensor.from(new Float16Array([1.5, -2, 65504]), [3], { dtype: "f16" });
    assert.deepEqual(Array.from(await t.read()), [1.5, -2, 65504]);
    const u = Tensor.from([0.1, 0.2, 0.3, 0.4, 0.5], [5]);
    assert.deepEqual(await u.read(), new Float32Array([0.1, 0.2, 0.3, 0.4, 0.5]));
    assert.equal(await Tensor.from([7], []).item(), 7);
    await assert.rejects(u.item(), /Tensor.item: tensor f32 \[5\] has 5 elements/);
    t.dispose();
    t.dispose(); // idempotent
    assert.ok(t.disposed);
    assert.throws(() => relu(t), /cannot use tensor f16 \[3\]: it was disposed/);
    await assert.rejects(t.read(), /cannot read tensor f16 \[3\]: it was disposed/);
    assert.throws(
      () => Tensor.from([1, 2, 3], [2, 2]),
      /Tensor.from: data has 3 values but shape \[2, 2\] \(f32\) needs 4/,
    );
    assert.throws(() => Tensor.zeros([2, -1]), /shape \[2, -1\] is invalid/);
    u.dispose();
  },
});

Deno.test({
  name: "tidy: frees intermediates, keeps what is returned",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from([1, -2, 3], [3]);
    const before = gpu.memoryStats().allocatedBytes;
    const kept = tidy(() => sum(mul(relu(x), x)));
    assert.equal(gpu.memoryStats().allocatedBytes - before, 256, "only the result remains");
    assert.equal(await kept.item(), 10);
    assert.ok(!x.disposed, "tensors made outside the scope survive");
    kept.dispose();
    x.dispose();
  },
});

Deno.test({
  name:
    "batching: the batch submits every maxDispatches without waiting; read() is the one sync point",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from([1, 2, 3], [3]);
    // A kernel's first dispatch is submitted alone (in case it failed to compile): warm up.
    tidy(() => add(x, x));
    await gpu.sync();
    const policy = gpu.batch.flushPolicy;
    const chain = (n: number) =>
      tidy(() => {
        let h = x;
        for (let i = 0; i < n; i++) h = add(h, x);
        return h;
      });
    try {
      // Only reads submit.
      gpu.batch.flushPolicy = { maxDispatches: Infinity, maxWork: Infinity };
      const before = { ...gpu.batch.counters };
      const y = chain(50);
      assert.equal(gpu.batch.counters.submits, before.submits, "50 ops, no submit");
      assert.equal(gpu.batch.counters.dispatches, before.dispatches + 50);
      assert.deepEqual(Array.from(await y.read()), [51, 102, 153]);
      assert.equal(gpu.batch.counters.submits, before.submits + 1, "one submit for the read");
      assert.equal(gpu.batch.counters.reads, before.reads + 1);
      y.dispose();
      // Submit every 16 dispatches: the GPU starts while the rest is recorded; no read happens.
      gpu.batch.flushPolicy = { maxDispatches: 16, maxWork: Infinity };
      const mid = { ...gpu.batch.counters };
      const z = chain(50);
      assert.equal(gpu.batch.counters.submits, mid.submits + 3, "submits after 16, 32 and 48");
      assert.equal(gpu.batch.counters.reads, mid.reads, "no wait");
      assert.deepEqual(Array.from(await z.read()), [51, 102, 153]);
      z.dispose();
    } finally {
      gpu.batch.flushPolicy = policy;
    }
    x.dispose();
  },
});

Deno.test({
  name: "batching: a loop that repeats its shapes reuses its bind groups",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from([1, 2, 3, 4], [2, 2], { requiresGrad: true });
    const step = () => {
      const loss = tidy(() => sum(relu(mul(add(x, x), x))));
      loss.backward();
      loss.dispose();
      x.grad!.dispose();
      x.grad = null;
    };
    step();
    step();
    const before = { ...gpu.batch.counters };
    for (let i = 0; i < 5; i++) step();
    const after = gpu.batch.counters;
    assert.equal(
      after.bindGroupHits - before.bindGroupHits,
      after.dispatches - before.dispatches,
      "every dispatch of a repeated step found its bind group",
    );
    await gpu.sync();
    x.dispose();
  },
});

Deno.test({
  name: "kernels: the cache key comes from the config, and only f16 kernels enable f16",
  ...GPU_TEST,
  fn() {
    const f32 = { op: "relu", dtype: "f32", out: "f32", vec4: false } as const;
    const f16 = { op: "relu", dtype: "f16", out: "f16", vec4: false } as const;
    assert.equal(
      kernelKey(unaryKernel, f32),
      kernelKey(unaryKernel, { vec4: false, out: "f32", dtype: "f32", op: "relu" }),
    );
    assert.notEqual(kernelKey(unaryKernel, f32), kernelKey(unaryKernel, f16));
    assert.ok(!unaryKernel.wgsl(f32).includes("enable f16"));
    assert.ok(unaryKernel.wgsl(f16).startsWith("enable f16;"));
    assert.equal(
      gpu.kernel(unaryKernel, f32),
      gpu.kernel(unaryKernel, { ...f32 }),
      "compiled once",
    );
  },
});

/** Runs `fn` while requestAdapter hands out adapters that lack shader-f16. */
async function withoutShaderF16<T>(fn: () => Promise<T>): Promise<T> {
  const real = navigator.gpu.requestAdapter;
  navigator.gpu.requestAdapter = async (options) => {
    const adapter = await real.call(navigator.gpu, options);
    if (!adapter) return adapter;
    const features = new Set([...adapter.features].filter((f) => f !== "shader-f16"));
    return new Proxy(adapter, {
      get(target, prop) {
        if (prop === "features") return features;
        const value = Reflect.get(target, prop, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  };
  try {
    return await fn();
  } finally {
    navigator.gpu.requestAdapter = real;
  }
}

Deno.test({
  name: "device: without shader-f16, 'auto' falls back to f32 and says so once; 'require' fails",
  ...GPU_TEST,
  async fn() {
    const warnings = await capturedWarnings(() =>
      withoutShaderF16(async () => {
        // On the builtin backend, whose adapters come from the navigator.gpu patched above (the
        // fallback is initGpu's own rule, the same for every backend).
        const options = { matmulTiling: "default", setDefault: false, backend: "builtin" } as const;
        const a = await initGpu(options), b = await initGpu(options);
        assert.equal(a.f16, false);
        assert.equal(b.f16, false);
        a.destroy();
        b.destroy();
        await assert.rejects(
          initGpu({ ...options, f16: "require" }),
          /f16 was required but the adapter .* has no shader-f16/,
        );
      })
    );
    assert.equal(warnings.filter((w) => w.includes("no shader-f16")).length, 1);
  },
});
