/**
 * Fuzzing `loadModule`: a few hundred seeded mutants (tests/helpers/file_mutations.ts)
 * each of an MLP file and a small CNN file with BatchNorm, loaded into a live
 * model. Every load either fails with a one-line HalfstepError and leaves every
 * parameter and buffer bit-identical, or loads exactly the saved values; with
 * checksums, no mutant that changes anything loads (only the neutral controls,
 * and those whose change removed the checksums themselves while the data stayed
 * the same); without checksums, no structural change loads.
 */
import assert from "node:assert/strict";
import { Tensor } from "../../gpu/mod.ts";
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  type HostTensor,
  Linear,
  MaxPool2d,
  type Module,
  ReLU,
  Sequential,
  tensorToEntry,
} from "../../nn/mod.ts";
import { loadModule, saveModule } from "../../nn/safetensors_file.ts";
import { mutations, withoutChecksums } from "../helpers/file_mutations.ts";
import { fuzzLoads, type LoadTarget } from "../helpers/load_fuzz.ts";
import { GPU_TEST } from "../helpers/gpu.ts";

const MUTANTS_WITH_CHECKSUMS = 300;
const MUTANTS_WITHOUT = 150;
function mlp(seed: number): Module {
  return new Sequential(
    new Linear(8, 16, { seed }),
    new ReLU(),
    new Linear(16, 4, { seed: seed + 1, dtype: "f16" }),
  );
}

function cnn(seed: number): Module {
  return new Sequential(
    new Conv2d(2, 4, 3, { seed }),
    new BatchNorm2d(4),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(16, 3, { seed: seed + 1 }),
  );
}

/** Every parameter and buffer's bytes by name (one GPU wait for all). */
async function hostState(m: Module): Promise<Record<string, HostTensor>> {
  const names = [...m.stateDict().keys()];
  const entries = await Promise.all([...m.stateDict().values()].map(tensorToEntry));
  return Object.fromEntries(names.map((name, i) => [name, entries[i]]));
}

/** `target` as a fuzz target of `loadModule`. */
async function moduleTarget(target: Module): Promise<LoadTarget> {
  const initial = new Map(Object.entries(await hostState(target)));
  return {
    load: (path) => loadModule(path, target),
    snapshot: () => hostState(target),
    restore: () => Promise.resolve(target.loadStateDict(initial)),
  };
}

for (const [name, make] of [["MLP", mlp], ["CNN with BatchNorm", cnn]] as const) {
  Deno.test({
    name: `loadModule fuzz (${name}): every mutant fails with one HalfstepError line and ` +
      "changes nothing, or loads exactly the saved values; no structural change or data flip loads",
    ...GPU_TEST,
    async fn() {
      const dir = await Deno.makeTempDir();
      const source = make(1), target = make(2);
      try {
        if (name !== "MLP") {
          // Move BatchNorm's running statistics off their initial values.
          const values = Float32Array.from({ length: 144 }, (_, i) => Math.sin(i));
          const x = Tensor.from(values, [2, 2, 6, 6]);
          source.forward(x).dispose();
          x.dispose();
        }
        await saveModule(`${dir}/source.safetensors`, source, { metadata: { epoch: "3" } });
        const file = await Deno.readFile(`${dir}/source.safetensors`);
        const saved = await hostState(source);
        const live = await moduleTarget(target);
        const withSums = await fuzzLoads(dir, live, mutations(file, 26, MUTANTS_WITH_CHECKSUMS), {
          saved,
          checksums: true,
        });
        const plain = withoutChecksums(file);
        const without = await fuzzLoads(dir, live, mutations(plain, 27, MUTANTS_WITHOUT), {
          saved,
          checksums: false,
        });
        const violations = [...withSums.violations, ...without.violations];
        assert.deepEqual(violations.slice(0, 10), [], `${violations.length} violation(s)`);
        assert.ok(withSums.failed > 0.8 * MUTANTS_WITH_CHECKSUMS, `${withSums.failed} failed`);
        assert.ok(without.loaded > 0 && without.failed > 0);
      } finally {
        source.dispose();
        target.dispose();
        await Deno.remove(dir, { recursive: true });
      }
    },
  });
}
