import assert from "node:assert/strict";
import {
  add,
  addInPlace,
  backward,
  gelu,
  mean,
  mul,
  noGrad,
  relu,
  reshape,
  scale,
  sum,
  Tensor,
  tidy,
} from "../../../gpu/mod.ts";
import { gpu, GPU_TEST } from "../../helpers/gpu.ts";
import { uniform } from "../../helpers/reference.ts";
import { assertClose, TOL } from "../../helpers/assert.ts";

Deno.test({
  name: "autograd: gradients accumulate (+=) over backward calls and over uses of a tensor",
  ...GPU_TEST,
  async fn() {
    const xv = uniform(10, 1);
    const x = Tensor.from(xv, [10], { requiresGrad: true });
    // x used twice in one graph: d/dx Σ x·x + 3x = 2x + 3
    const f = () => tidy(() => add(sum(mul(x, x)), sum(scale(x, 3))));
    const y1 = f();
    y1.backward();
    assertClose(await x.grad!.read(), xv.map((v) => 2 * v + 3), TOL.f32, "one backward");
    const y2 = f();
    backward(y2);
    assertClose(
      await x.grad!.read(),
      xv.map((v) => 2 * (2 * v + 3)),
      TOL.f32,
      "two backwards add up",
    );
    [x, y1, y2].forEach((t) => t.dispose());
  },
});

Deno.test({
  name: "autograd: a pass-through gradient reaching two leaves gives each its own buffer",
  ...GPU_TEST,
  async fn() {
    const a = Tensor.from([1, 2], [2], { requiresGrad: true });
    const b = Tensor.from([3, 4], [2], { requiresGrad: true });
    const y = add(a, b); // add passes its gradient straight to both inputs
    y.backward({ gradient: Tensor.from([1, 1], [2]) });
    assert.ok(!a.grad!.sharesMemoryWith(b.grad!));
    // A second backward accumulates into a.grad only; b.grad must not move.
    add(a, scale(a, 0)).backward({ gradient: Tensor.from([5, 5], [2]) });
    assert.deepEqual(Array.from(await a.grad!.read()), [6, 6]);
    assert.deepEqual(Array.from(await b.grad!.read()), [1, 1]);
  },
});

Deno.test({
  name: "autograd: noGrad records nothing; leaves without requiresGrad get no gradient",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.from([1, 2, 3], [3], { requiresGrad: true });
      const c = Tensor.from([1, 1, 1], [3]);
      const y = noGrad(() => mul(x, c));
      assert.equal(y.requiresGrad, false);
      assert.equal(y.gradFn, null);
      assert.throws(() => sum(y).backward(), /backward: tensor f32 \[\] does not require grad/);
      const z = sum(mul(x, c));
      z.backward();
      assert.equal(c.grad, null);
      assert.ok(x.grad);
    });
  },
});

Deno.test({
  name: "autograd: saved activations are freed by backward; a second backward is a clear error",
  ...GPU_TEST,
  async fn() {
    const n = 64 * 1024; // 256 KiB per f32 activation
    const x = Tensor.from(uniform(n, 3), [n], { requiresGrad: true });
    await gpu.sync();
    const before = gpu.memoryStats().allocatedBytes;
    // Ten layers, each saving its input: forward holds ten activations.
    const loss = tidy(() => {
      let h = x;
      for (let i = 0; i < 10; i++) h = gelu(h);
      return mean(h);
    });
    const afterForward = gpu.memoryStats().allocatedBytes;
    assert.ok(
      afterForward - before >= 9 * n * 4,
      `forward holds activations (${afterForward - before} bytes)`,
    );
    gpu.resetPeakMemory();
    loss.backward();
    const stats = gpu.memoryStats();
    // Released as they are used: backward never needs more than a few buffers on top.
    assert.ok(
      stats.peakBytes <= afterForward + 3 * n * 4,
      `peak during backward ${stats.peakBytes - afterForward} over forward`,
    );
    // Only the leaf's gradient (and the loss) remain.
    assert.ok(
      stats.allocatedBytes <= before + n * 4 + 256,
      `left after backward: ${stats.allocatedBytes - before}`,
    );
    assert.throws(() => loss.backward(), /were freed, by an earlier backward\(\)/);
    loss.dispose();
    x.grad!.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "autograd: backward needs a scalar or an explicit gradient of the same shape",
  ...GPU_TEST,
  fn() {
    tidy(() => {
      const x = Tensor.from([1, 2], [2], { requiresGrad: true });
      const y = relu(x);
      assert.throws(() => y.backward(), /backward: output f32 \[2\] is not a single value/);
      assert.throws(
        () => y.backward({ gradient: Tensor.zeros([3]) }),
        /backward: gradient f32 \[3\] must match output f32 \[2\]/,
      );
    });
  },
});

Deno.test({
  name: "autograd: a 2000-op chain backpropagates without recursion limits, every op counted",
  ...GPU_TEST,
  async fn() {
    // h ← a·h + x, 1000 times (2000 ops, x used 1001 times): h = x·Σ_{k=0..1000} aᵏ, and
    // dh/dx is the same sum (632.5 at a = 0.999). Each term is at least a¹⁰⁰⁰ = 0.37, so an
    // op dropped from forward or backward moves the result by 6e-4 relative or more; f32
    // roundoff over the chain stays near 1000 · 6e-8.
    const a = 0.999, n = 1000, x = Tensor.from([0.5], [1], { requiresGrad: true });
    const y = tidy(() => {
      let h: Tensor = x;
      for (let i = 0; i < n; i++) h = add(scale(h, a), x);
      return sum(h);
    });
    let total = 0;
    for (let k = 0; k <= n; k++) total += a ** k;
    const tol = { atol: 0, rtol: 2e-4 };
    assertClose([await y.item()], [0.5 * total], tol, "forward");
    y.backward();
    assertClose([await x.grad!.item()], [total], tol, "gradient");
    y.dispose();
    x.grad!.dispose();
    x.dispose();
  },
});

Deno.test({
  name: "autograd: a graph abandoned without backward frees its saved activations",
  ...GPU_TEST,
  async fn() {
    const x = Tensor.from(uniform(4096, 1), [4096], { requiresGrad: true });
    await gpu.sync();
    const before = gpu.memoryStats().allocatedBytes;
    const loss = tidy(() => mean(gelu(gelu(x))));
    assert.ok(
      gpu.memoryStats().allocatedBytes >= before + 4096 * 4,
      "the inner activation is held",
    );
    loss.dispose(); // e.g. an evaluation forward that forgot noGrad
    assert.equal(gpu.memoryStats().allocatedBytes, before);
    x.dispose();
  },
});

Deno.test({
  name: "addInPlace: x += a·x works (one buffer cannot be read and written in one dispatch)",
  ...GPU_TEST,
  async fn() {
    const v = Tensor.from([1, 2, 3], [3]);
    addInPlace(v, v, { alpha: -0.5 });
    assert.deepEqual(Array.from(await v.read()), [0.5, 1, 1.5]);
    assert.throws(
      () => addInPlace(v, Tensor.zeros([2])),
      /addInPlace: shapes differ \(f32 \[3\] \+= f32 \[2\]\)/,
    );
    const p = Tensor.from([1], [1], { requiresGrad: true });
    assert.throws(
      () => addInPlace(p, p),
      /requires grad; an in-place update would silently corrupt/,
    );
    v.dispose();
  },
});

Deno.test({
  name: "autograd: an incoming gradient passed straight through is handed on, not copied; " +
    "every destination still owns its buffer",
  ...GPU_TEST,
  async fn() {
    const xv = uniform(6, 3), wv = uniform(6, 4), cv = uniform(6, 5);
    const x = Tensor.from(xv, [2, 3], { requiresGrad: true });
    const w = Tensor.from(wv, [6], { requiresGrad: true });
    const c = Tensor.from(cv, [6]);
    // y = Σ c·(reshape(x) + w) + Σ (x + x): add and reshape pass their gradient on.
    const { copies } = gpu.batch.counters;
    const y = tidy(() => add(sum(mul(add(reshape(x, [6]), w), c)), sum(add(x, x))));
    y.backward();
    // One copy each where one buffer goes to two uses: add(x, x), and w's share of
    // add(reshape(x), w); and two of the seed, which the outer add hands to both sums
    // (the seed is the caller's). Before, every pass-through copied too (7 in all).
    assert.equal(gpu.batch.counters.copies - copies, 4, "copies in backward");
    assertClose(await x.grad!.read(), cv.map((v) => v + 2), TOL.f32, "dx = c + 2");
    assertClose(await w.grad!.read(), cv, TOL.f32, "dw = c");
    assert.ok(!x.grad!.sharesMemoryWith(w.grad!));
    // In-place work on one gradient leaves the other alone.
    addInPlace(w.grad!, w.grad!);
    assertClose(await x.grad!.read(), cv.map((v) => v + 2), TOL.f32, "dx after dw += dw");
    // The caller's gradient is copied, never taken: it is theirs to use again.
    const g = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3]);
    const z = tidy(() => add(x, reshape(w, [2, 3])));
    z.backward({ gradient: g });
    assert.deepEqual(Array.from(await g.read()), [1, 2, 3, 4, 5, 6]);
    assert.ok(!x.grad!.sharesMemoryWith(g) && !w.grad!.sharesMemoryWith(g));
    assertClose(await x.grad!.read(), cv.map((v, i) => v + 2 + i + 1), TOL.f32, "dx += g");
    for (const t of [x, w, c, y, z, g]) t.grad?.dispose(), t.dispose();
  },
});
