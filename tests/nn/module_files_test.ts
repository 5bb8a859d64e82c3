import assert from "node:assert/strict";
import { join } from "node:path";
import { Tensor, ValueError } from "../../gpu/mod.ts";
import {
  BatchNorm,
  encodeSafetensors,
  LayerNorm,
  Linear,
  ReLU,
  Sequential,
  type StateValue,
} from "../../nn/mod.ts";
import { loadModule, saveModule, saveSafetensors } from "../../nn/safetensors_file.ts";
import { saveTrainingState } from "../../files.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

function model(seed: number) {
  return new Sequential(
    new Linear(6, 5, { seed }),
    new BatchNorm(5),
    new ReLU(),
    new LayerNorm(5),
    new Linear(5, 3, { seed: seed + 1, dtype: "f16" }),
  );
}

async function snapshot(m: Sequential): Promise<Map<string, Float32Array | Int32Array>> {
  const out = new Map<string, Float32Array | Int32Array>();
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
    await saveModule(`${dir}/m.safetensors`, a, { metadata: { note: "test" } });
    assert.equal((await a.layers[1].stateDict().get("num_batches_tracked")!.read())[0], 1);
    const b = model(7);
    assert.deepEqual(await loadModule(`${dir}/m.safetensors`, b), { note: "test" });
    assert.deepEqual(await snapshot(b), await snapshot(a));
    assert.deepEqual(
      [...b.stateDict().keys()].sort(),
      [
        "0.bias",
        "0.weight",
        "1.bias",
        "1.num_batches_tracked",
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
  name: "loadModule: a state dict without num_batches_tracked (halfstep 0.1) loads; floats of " +
    "another width are converted as PyTorch's load_state_dict casts",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const a = model(1);
      const state = new Map(a.stateDict());
      state.delete("1.num_batches_tracked");
      await saveSafetensors(`${dir}/old.safetensors`, state);
      const b = model(2);
      const counter = b.stateDict().get("1.num_batches_tracked")!;
      counter.writeBytes(new Uint8Array(new Int32Array([5]).buffer));
      await loadModule(`${dir}/old.safetensors`, b);
      assert.equal((await counter.read())[0], 5, "a missing counter keeps its value");
      assert.deepEqual(
        await b.stateDict().get("1.running_var")!.read(),
        await a.stateDict().get("1.running_var")!.read(),
      );
      // The f16 layer 4 saved, then loaded into an f32 twin: widened exactly; back: rounded.
      const wide = new Sequential(
        new Linear(6, 5, { seed: 3 }),
        new BatchNorm(5),
        new ReLU(),
        new LayerNorm(5),
        new Linear(5, 3, { seed: 4 }),
      );
      await loadModule(`${dir}/old.safetensors`, wide);
      const f16Weight = await a.stateDict().get("4.weight")!.read();
      assert.equal(wide.stateDict().get("4.weight")!.dtype, "f32");
      assert.deepEqual(await wide.stateDict().get("4.weight")!.read(), f16Weight);
      await saveModule(`${dir}/wide.safetensors`, wide);
      const narrow = model(5);
      await loadModule(`${dir}/wide.safetensors`, narrow);
      const w0 = await wide.stateDict().get("0.weight")!.read();
      assert.deepEqual(await narrow.stateDict().get("0.weight")!.read(), w0);
      for (const m of [a, b, wide, narrow]) m.dispose();
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
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

Deno.test({
  name: "saveModule: non-finite weights are refused by default, naming the tensor; the file " +
    "already at the path stays and no temporary is left; allowNonFinite saves them",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/run.safetensors`;
    const listing = async () =>
      (await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort();
    const good = model(1);
    const diverged = model(2);
    try {
      await saveModule(path, good);
      const before = await Deno.readFile(path);
      const bad = new Float32Array(30).fill(NaN);
      bad[3] = 1;
      bad[4] = Infinity;
      diverged.stateDict().get("0.weight")!.writeBytes(new Uint8Array(bad.buffer));
      await assert.rejects(saveModule(path, diverged), (err: Error) => {
        assert.ok(err instanceof ValueError, `${err}`);
        assert.equal(
          err.message,
          `saveModule: "${path}": tensor "0.weight" holds 29 non-finite value(s) (NaN or ±Inf: ` +
            "training has diverged); the file was left unchanged. Pass { allowNonFinite: true } " +
            "to save it anyway.",
        );
        return true;
      });
      assert.deepEqual(await Deno.readFile(path), before, "the good file is untouched");
      assert.deepEqual(await listing(), ["run.safetensors"]);
      await saveModule(path, diverged, { allowNonFinite: true, metadata: { note: "nan" } });
      const copy = model(3);
      assert.deepEqual(await loadModule(path, copy, { allowNonFinite: true }), { note: "nan" });
      assert.deepEqual(await snapshot(copy), await snapshot(diverged));
      copy.dispose();
    } finally {
      good.dispose();
      diverged.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "loadStateDict: a state of the module's own tensors (itself, swapped, shared, views) " +
    "loads as if copied first",
  ...GPU_TEST,
  async fn() {
    const square = () =>
      new Sequential(new Linear(4, 4, { seed: 1 }), new ReLU(), new Linear(4, 4, { seed: 2 }));
    const m = square();
    const before = await snapshot(m);
    m.loadStateDict(m.stateDict());
    assert.deepEqual(await snapshot(m), before, "its own state dict is a no-op");
    const own = m.stateDict();
    m.loadStateDict(new Map([...own].map(([name, t]) => [name, t.share()])));
    assert.deepEqual(await snapshot(m), before, "views of its own tensors too");
    // Swapped: each layer gets the other's weight, as a copy taken before any write would.
    const swapped = new Map(own);
    swapped.set("0.weight", own.get("2.weight")!);
    swapped.set("2.weight", own.get("0.weight")!);
    m.loadStateDict(swapped);
    const after = await snapshot(m);
    assert.deepEqual(after.get("0.weight"), before.get("2.weight"));
    assert.deepEqual(after.get("2.weight"), before.get("0.weight"));
    // Shared: one tensor into two destinations (one of them its own).
    const fresh = m.stateDict();
    const shared = new Map(fresh);
    shared.set("2.weight", fresh.get("0.weight")!);
    shared.set("2.bias", fresh.get("0.bias")!);
    m.loadStateDict(shared);
    const last = await snapshot(m);
    assert.deepEqual(last.get("2.weight"), after.get("0.weight"));
    assert.deepEqual(last.get("0.weight"), after.get("0.weight"));
    assert.deepEqual(last.get("2.bias"), after.get("0.bias"));
    m.dispose();
  },
});

Deno.test({
  name: "loadStateDict/loadModule: long names are cut in one short message; unknown and " +
    "disposed sources are refused with nothing written",
  ...GPU_TEST,
  async fn() {
    const m = model(1);
    const before = await snapshot(m);
    const huge = "x".repeat(10_000_000);
    const host = { dtype: "f32" as const, shape: [1], data: new Uint8Array(4) };
    const state = new Map<string, StateValue>(m.stateDict());
    state.set(huge, host);
    assert.throws(() => m.loadStateDict(state), (err: Error) => {
      assert.ok(err instanceof ValueError, `${err}`);
      assert.ok(err.message.length < 300, `${err.message.length} characters`);
      assert.match(err.message, /: unexpected x{79}… \(nothing was changed\)\.$/);
      return true;
    });
    const disposed = Tensor.zeros([5]);
    disposed.dispose();
    const withDisposed = new Map<string, StateValue>(m.stateDict());
    withDisposed.set("0.bias", Tensor.from([1, 2, 3, 4, 5], [5]));
    withDisposed.set("1.weight", disposed);
    assert.throws(() => m.loadStateDict(withDisposed), /1\.weight.*disposed/);
    assert.deepEqual(await snapshot(m), before, "nothing was written");
    // Through a file: a 10 MB name in the header.
    const dir = await Deno.makeTempDir();
    try {
      const path = `${dir}/long.safetensors`;
      await Deno.writeFile(path, encodeSafetensors(new Map([[huge, host]])));
      await assert.rejects(loadModule(path, m), (err: Error) => {
        assert.ok(err instanceof ValueError, `${err}`);
        assert.ok(err.message.length < 400, `${err.message.length} characters`);
        return true;
      });
      assert.deepEqual(await snapshot(m), before);
    } finally {
      await Deno.remove(dir, { recursive: true });
      m.dispose();
    }
  },
});

Deno.test({
  name: "saveModule / saveSafetensors / saveTrainingState: an old positional metadata map or " +
    "extra value where the options object now stands is refused, not dropped",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/m.safetensors`;
    const model = new Linear(2, 2, { seed: 1 });
    const loose = saveModule as (p: string, m: Linear, o: unknown) => Promise<void>;
    await assert.rejects(
      loose(path, model, { step: "1000" }),
      (e: Error) =>
        e instanceof ValueError && /^saveModule: unknown option step/.test(e.message) &&
        /\{ metadata \}/.test(e.message),
    );
    const looseTensors = saveSafetensors as (p: string, t: unknown, o: unknown) => Promise<void>;
    await assert.rejects(
      looseTensors(path, { w: model.weight }, null),
      /options must be an object/,
    );
    const looseState = saveTrainingState as (
      p: string,
      parts: unknown,
      o: unknown,
    ) => Promise<void>;
    await assert.rejects(looseState(path, { model }, 3), /^ValueError: saveTrainingState: options/);
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound, "nothing was written");
    await saveModule(path, model, { metadata: { step: "1000" } });
    model.dispose();
    await Deno.remove(dir, { recursive: true });
  },
});

Deno.test({
  name: "loadModule: a path that never ends (/dev/zero) or holds no header is refused at once, " +
    "its header length checked before anything else is read",
  ignore: Deno.build.os === "windows",
  ...GPU_TEST,
  async fn() {
    const m = model(1);
    const before = await snapshot(m);
    // Reading /dev/zero to its end never finishes: the loader must stop after the header length.
    const cases: [string, RegExp][] = [
      ["/dev/zero", /"\/dev\/zero" is not a valid safetensors file: The header is not valid/],
      ["/dev/null", /"\/dev\/null" is not a valid safetensors file: The file is 0 bytes/],
    ];
    for (const [path, message] of cases) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const tooLong = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${path}: still reading after 5 s`)), 5_000);
      });
      try {
        await assert.rejects(() => Promise.race([loadModule(path, m), tooLong]), message);
      } finally {
        clearTimeout(timer);
      }
    }
    assert.deepEqual(await snapshot(m), before, "unchanged");
    m.dispose();
  },
});

Deno.test({
  name: "saveModule through a symbolic link replaces the file it names and leaves the link a link",
  ignore: Deno.build.os === "windows",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    const m = model(1), other = model(5);
    try {
      const file = join(dir, "model.safetensors"), link = join(dir, "latest.safetensors");
      await saveModule(file, m);
      await Deno.symlink("model.safetensors", link); // relative, as `ln -s` makes them
      await saveModule(link, other);
      assert.ok((await Deno.lstat(link)).isSymlink, "the link is still a link");
      const copy = model(9);
      await loadModule(file, copy);
      assert.deepEqual(await snapshot(copy), await snapshot(other), "the file it names was saved");
      copy.dispose();
      const names = [];
      for await (const e of Deno.readDir(dir)) names.push(e.name);
      assert.deepEqual(names.sort(), ["latest.safetensors", "model.safetensors"], "no temporary");
    } finally {
      m.dispose();
      other.dispose();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
