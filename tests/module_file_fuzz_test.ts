/**
 * Fuzzing `loadModule`: a few hundred seeded mutants (tests/_file_mutations.ts)
 * each of an MLP file and a small CNN file with BatchNorm, loaded into a live
 * model. Every load either fails with a one-line HalfstepError and leaves every
 * parameter and buffer bit-identical, or loads exactly the saved values; with
 * checksums, no mutant that changes anything loads (only the neutral controls,
 * and those whose change removed the checksums themselves while the data stayed
 * the same); without checksums, no structural change loads.
 */
import assert from "node:assert/strict";
import { HalfstepError, Tensor } from "../gpu/mod.ts";
import {
  BatchNorm2d,
  Conv2d,
  decodeSafetensors,
  Flatten,
  type HostTensor,
  Linear,
  MaxPool2d,
  type Module,
  ReLU,
  Sequential,
  tensorToEntry,
} from "../nn/mod.ts";
import { loadModule, saveModule } from "../nn/safetensors_file.ts";
import { type Mutant, mutations, splitFile, withoutChecksums } from "./_file_mutations.ts";
import { GPU_TEST } from "./_gpu.ts";

const MUTANTS_WITH_CHECKSUMS = 300;
const MUTANTS_WITHOUT = 150;
/** Failed loads between two checks that the model is unchanged (each check is one GPU wait). */
const BATCH = 60;
/** Mutations that change the structure: they must fail even in a file without checksums. */
const STRUCTURAL = new Set([
  "length-bit",
  "shape-edit",
  "json-drop-key",
  "rename",
  "truncate",
  "append",
]);

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

/** Every parameter and buffer's bytes (one GPU wait for all). */
async function hostState(m: Module): Promise<Map<string, HostTensor>> {
  const names = [...m.stateDict().keys()];
  const entries = await Promise.all([...m.stateDict().values()].map(tensorToEntry));
  return new Map(names.map((name, i) => [name, entries[i]]));
}

/** Names whose bytes differ between two states. */
function differences(a: Map<string, HostTensor>, b: Map<string, HostTensor>): string[] {
  return [...a.keys()].filter((name) => {
    const x = a.get(name)!.data, y = b.get(name)?.data;
    return !y || x.length !== y.length || x.some((v, i) => v !== y[i]);
  });
}

function decodes(bytes: Uint8Array): boolean {
  try {
    decodeSafetensors(bytes);
    return true;
  } catch {
    return false;
  }
}

function hasChecksums(bytes: Uint8Array): boolean {
  try {
    const metadata = splitFile(bytes).header.__metadata__ as Record<string, unknown> | undefined;
    return metadata !== undefined && Object.hasOwn(metadata, "halfstep.checksums");
  } catch {
    return false;
  }
}

/** Loads every mutant into `target`; returns the rule violations and counts by outcome. */
async function fuzz(
  dir: string,
  target: Module,
  saved: Map<string, HostTensor>,
  mutants: Iterable<Mutant>,
  checksums: boolean,
): Promise<{ violations: string[]; loaded: number; failed: number }> {
  const initial = await hostState(target);
  const violations: string[] = [];
  let pending: string[] = [], loaded = 0, failed = 0;
  const checkUnchanged = async () => {
    const changed = differences(initial, await hostState(target));
    if (changed.length > 0) {
      violations.push(`failed loads changed ${changed.join(", ")}; one of: ${pending.join("; ")}`);
    }
    pending = [];
  };
  const path = `${dir}/mutant.safetensors`;
  for (const m of mutants) {
    const what = `${m.kind} (${m.detail.slice(0, 80)})`;
    await Deno.writeFile(path, m.bytes);
    // A load that succeeds overwrites the model: check the failures before it first.
    if (pending.length > 0 && decodes(m.bytes)) await checkUnchanged();
    try {
      await loadModule(path, target);
    } catch (err) {
      failed++;
      if (m.neutral) violations.push(`${what} is harmless but failed: ${err}`);
      const message = (err as Error).message ?? "";
      if (!(err instanceof HalfstepError)) violations.push(`${what}: not a HalfstepError: ${err}`);
      else if (message.includes("\n") || message.length > 300) {
        violations.push(`${what}: not one short line (${message.length} chars): ${message}`);
      }
      pending.push(what);
      if (pending.length >= BATCH) await checkUnchanged();
      continue;
    }
    loaded++;
    const wrong = differences(saved, await hostState(target));
    const mustFail = !m.neutral &&
      (checksums ? hasChecksums(m.bytes) || wrong.length > 0 : STRUCTURAL.has(m.kind));
    if (mustFail) violations.push(`${what} loaded${wrong.length ? `: ${wrong.join(", ")}` : ""}`);
    else if (checksums && wrong.length > 0) violations.push(`${what} loaded other values`);
    target.loadStateDict(initial);
  }
  await checkUnchanged();
  return { violations, loaded, failed };
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
          const x = Tensor.from(Float32Array.from({ length: 144 }, (_, i) => Math.sin(i)), [
            2,
            2,
            6,
            6,
          ]);
          source.forward(x).dispose();
          x.dispose();
        }
        await saveModule(`${dir}/source.safetensors`, source, { metadata: { epoch: "3" } });
        const file = await Deno.readFile(`${dir}/source.safetensors`);
        const saved = await hostState(source);
        const withSums = await fuzz(
          dir,
          target,
          saved,
          mutations(file, 26, MUTANTS_WITH_CHECKSUMS),
          true,
        );
        const plain = withoutChecksums(file);
        const without = await fuzz(
          dir,
          target,
          saved,
          mutations(plain, 27, MUTANTS_WITHOUT),
          false,
        );
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
