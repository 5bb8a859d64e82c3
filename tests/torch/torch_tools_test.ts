/**
 * The Python tools fail like halfstep, not like scripts (issue 39): bad
 * input to `continue_ddp.py` (a missing, truncated, bit-flipped or
 * mid-accumulation file, another model, a run without mnist.ts's record, a
 * finished schedule, a batch that does not split) and to `to_halfstep.py`
 * (a truncated checkpoint, `amsgrad` or `maximize`, a `--schedule` that does
 * not give the checkpoint's learning rate) is one line on stderr and a
 * non-zero exit, never a traceback; a finished schedule goes on once
 * `--schedule` extends it. Damaged records, schedules, optimizer and scaler
 * states, and checkpoints with a float64 model or no state dict, are one
 * line too, before any process starts; `write_safetensors` leaves no
 * temporary file behind and writes through a symbolic link to its file.
 *
 * Needs a Python with torch (CI installs Debian's python3-torch): without
 * one the test fails, it never skips.
 *
 * Default pass only (.ci/run leaves it out of the Dawn pass, as deno task
 * test runs it after the parallel part): the tools run in PyTorch's processes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  AdamW,
  AmpTrainer,
  cosineSchedule,
  crossEntropy,
  Linear,
  LrScheduler,
  type Module,
  Tensor,
} from "../../mod.ts";
import { saveTrainingState } from "../../files.ts";
import { mnistDataDir } from "../../examples/data/mnist.ts";
import { mnistMlp } from "../../examples/mnist/model.ts";
import { GPU_TEST } from "../helpers/gpu.ts";
import { runPython, torchPython } from "../helpers/torch.ts";
import { runTorchScript } from "../helpers/torch_script.ts";

const TOOLS = new URL("../../examples/torch/", import.meta.url).pathname;

/** Runs a tool; its exit status and output (it may fail: that is what is tested). */
async function tool(
  script: string,
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(torchPython(), {
    args: ["-B", join(TOOLS, script), ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** Asserts a refusal: exit status `code`, one line of stderr matching `message`, no traceback. */
function assertOneLine(
  r: { code: number; stderr: string },
  code: number,
  message: RegExp,
  what: string,
) {
  const lines = r.stderr.trim().split("\n");
  assert.equal(r.code, code, `${what}: ${r.stderr}`);
  assert.equal(lines.length, 1, `${what}: one line, got:\n${r.stderr}`);
  assert.doesNotMatch(r.stderr, /Traceback/, what);
  assert.match(lines[0], message, what);
}

/** mnist.ts's record of a run of 2 epochs of 4 steps (64 images, batch 16) at `step`. */
function record(step: number) {
  return {
    epoch: Math.floor(step / 4),
    step,
    position: step % 4,
    shuffler: { seed: 1, offset: Math.floor(step / 4) * 64 },
    flags: { shape: { model: "mlp", shift: 0, accum: 1, limit: 64, batch: 16, epochs: 2 } },
  };
}

/** Saves `model` trained `steps` AdamW steps on a cosine schedule of `total` steps. */
async function saveRun(
  path: string,
  model: Module,
  options: { steps: number; total: number; extra?: unknown; accumulation?: number },
) {
  const optimizer = new AdamW(model.parameters(), { lr: 1e-3 });
  const scheduler = new LrScheduler(
    optimizer,
    cosineSchedule({ warmupSteps: 0, totalSteps: options.total }),
  );
  const trainer = new AmpTrainer(model, optimizer, {
    enabled: false,
    accumulationSteps: options.accumulation ?? 1,
  });
  const inputs = model instanceof Linear ? 4 : 784;
  for (let s = 0; s < options.steps; s++) {
    const x = Tensor.from(new Float32Array(2 * inputs).fill(0.5), [2, inputs]);
    trainer.step(() => crossEntropy(model.forward(x), [0, 1])).dispose();
    if (trainer.steps > scheduler.stepCount) scheduler.step();
    x.dispose();
  }
  await saveTrainingState(path, { model, optimizer, trainer, scheduler }, { extra: options.extra });
  trainer.dispose();
}

Deno.test({
  name: "continue_ddp.py: bad input is one line and a non-zero exit; a finished schedule is " +
    "refused until --schedule extends it",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const good = join(dir, "good.safetensors");
      await saveRun(good, mnistMlp(1), { steps: 8, total: 8, extra: record(8) });
      const bytes = await Deno.readFile(good);
      const truncated = join(dir, "truncated.safetensors");
      await Deno.writeFile(truncated, bytes.subarray(0, 5000));
      const flipped = join(dir, "flipped.safetensors");
      const damaged = bytes.slice();
      damaged[damaged.length - 100] ^= 0x10; // a bit of the last tensor's data
      await Deno.writeFile(flipped, damaged);
      const other = join(dir, "other.safetensors");
      await saveRun(other, new Linear(4, 2, { seed: 1 }), { steps: 1, total: 8, extra: record(1) });
      const partial = join(dir, "partial.safetensors");
      await saveRun(partial, mnistMlp(2), {
        steps: 1,
        total: 8,
        accumulation: 2,
        extra: record(0),
      });
      const norecord = join(dir, "norecord.safetensors");
      await saveRun(norecord, mnistMlp(3), { steps: 1, total: 8 });
      const flags = ["--mnist", mnistDataDir(), "--procs", "1", "--device", "cpu"];
      const cases: [string, string[], number, RegExp][] = [
        [
          "missing",
          [join(dir, "nope.safetensors")],
          1,
          /^continue_ddp: .*nope\.safetensors: no such file$/,
        ],
        [
          "truncated",
          [truncated],
          1,
          /truncated\.safetensors: tensor '.*' is truncated or malformed$/,
        ],
        ["bit flip", [flipped], 1, /flipped\.safetensors: tensor '.*' was changed after saving/],
        ["another model", [other], 1, /other\.safetensors: not the examples' MLP 784-256-256-10/],
        ["mid-accumulation", [partial], 1, /partial\.safetensors: saved mid-accumulation/],
        ["no record", [norecord], 1, /holds no record of an examples\/mnist\.ts run/],
        ["finished", [good], 2, /its schedule is finished \(step 8 of 8\).*--schedule/],
        [
          "batch",
          [good, "--procs", "3", "--steps", "2"],
          2,
          /batch 16 does not split over --procs 3/,
        ],
        ["bad flag", [good, "--steps", "many"], 2, /^continue_ddp: argument --steps: invalid int/],
      ];
      for (const [what, args, code, message] of cases) {
        const r = await tool("continue_ddp.py", [...flags, ...args]); // later flags win
        assertOneLine(r, code, message, what);
      }
      // Extended, the finished run trains on from its step 8 to the new total and saves.
      const extended = join(dir, "extended.safetensors");
      const schedule = "cosine:warmup=0,total=12";
      const printed = await runPython([
        join(TOOLS, "continue_ddp.py"),
        good,
        ...flags,
        ...["--schedule", schedule, "--save", extended],
      ]);
      assert.match(printed, /continue_ddp: step 12 \(4\/4; epoch 4, 0\/4\)/);
      const back = await Deno.readFile(extended);
      const header = JSON.parse(
        new TextDecoder().decode(
          back.subarray(8, 8 + Number(new DataView(back.buffer).getBigUint64(0, true))),
        ),
      );
      assert.equal(JSON.parse(header.__metadata__.scheduler).last_epoch, 12);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("to_halfstep.py: bad input is one line and a non-zero exit; the schedule must give the checkpoint's lr", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const checkpoint = async (name: string, options: string) => {
      const path = join(dir, name);
      await runTorchScript("adamw_cosine_checkpoint.py", [path, options]);
      return path;
    };
    const plain = await checkpoint("plain.pt", "{}");
    const amsgrad = await checkpoint("amsgrad.pt", '{"amsgrad": true}');
    const maximize = await checkpoint("maximize.pt", '{"maximize": true}');
    const truncated = join(dir, "truncated.pt");
    await Deno.writeFile(truncated, (await Deno.readFile(plain)).subarray(0, 3000));
    const out = join(dir, "run.safetensors");
    const right = ["--optimizer", "AdamW", "--schedule", "cosine:warmup=20,total=400"];
    const cases: [string, string[], number, RegExp][] = [
      [
        "truncated",
        [truncated, out, ...right],
        1,
        /^to_halfstep: .*truncated\.pt: not a readable torch\.save file/,
      ],
      ["missing", [join(dir, "no.pt"), out, ...right], 1, /no\.pt: no such file$/],
      [
        "amsgrad",
        [amsgrad, out, ...right],
        1,
        /group 0 has amsgrad=True, which halfstep's optimizers do not implement/,
      ],
      ["maximize", [maximize, out, ...right], 1, /group 0 has maximize=True/],
      [
        "another schedule",
        [plain, out, "--optimizer", "AdamW", "--schedule", "cosine:warmup=10,total=400"],
        2,
        /--schedule cosine:warmup=10,total=400: at the checkpoint's step 3 it gives lr 0\.0006 \(group 0\), the checkpoint's is 0\.0003/,
      ],
      ["no schedule", [plain, out, "--optimizer", "AdamW"], 2, /name its schedule with --schedule/],
      [
        "bad schedule",
        [plain, out, "--optimizer", "AdamW", "--schedule", "steps"],
        2,
        /expected cosine\|linear/,
      ],
    ];
    for (const [what, args, code, message] of cases) {
      const r = await tool("to_halfstep.py", args);
      assertOneLine(r, code, message, what);
      assert.ok(!(await Deno.stat(out).then(() => true, () => false)), `${what}: nothing written`);
    }
    const ok = await tool("to_halfstep.py", [plain, out, ...right]);
    assert.equal(ok.code, 0, ok.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "continue_ddp.py and to_halfstep.py: a damaged header, record, schedule, optimizer or " +
    "scaler, a float64 model and a model that is not a state dict are one line, before any " +
    "process starts",
  ...GPU_TEST,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const good = join(dir, "good.safetensors");
      await saveRun(good, mnistMlp(1), { steps: 2, total: 8, extra: record(2) });
      await runTorchScript("damaged_runs.py", [good, dir]);
      const file = (name: string) => join(dir, name);
      // Two processes: a check left to them used to print one line per process.
      const flags = ["--mnist", mnistDataDir(), "--procs", "2", "--device", "cpu"];
      const cases: [string, RegExp][] = [
        ["noshape.safetensors", /noshape\.safetensors: tensor 'w' is truncated or malformed$/],
        [
          "noseed.safetensors",
          /noseed\.safetensors: holds no record of an examples\/mnist\.ts run/,
        ],
        ["nolastepoch.safetensors", /nolastepoch\.safetensors: holds no learning-rate schedule/],
        [
          "badschedule.safetensors",
          /badschedule\.safetensors: its learning-rate schedule .*"step".* is not one of halfstep's/,
        ],
        [
          "amsgrad.safetensors",
          /amsgrad\.safetensors: optimizer group 0 has amsgrad=True, which halfstep's optimizers/,
        ],
        ["hysteresis.safetensors", /hysteresis\.safetensors: .*hysteresis or a static scale/],
      ];
      for (const [name, message] of cases) {
        const r = await tool("continue_ddp.py", [file(name), ...flags]);
        assertOneLine(r, 1, new RegExp(`^continue_ddp: .*${message.source}`), name);
      }
      const out = file("run.safetensors");
      const convert = ["--optimizer", "AdamW"];
      assertOneLine(
        await tool("to_halfstep.py", [file("f64.pt"), out, ...convert]),
        1,
        /^to_halfstep: model\.0\.weight is torch\.float64; halfstep reads float32/,
        "a float64 model",
      );
      assertOneLine(
        await tool("to_halfstep.py", [file("listmodel.pt"), out, ...convert]),
        1,
        /^to_halfstep: .*listmodel\.pt: its 'model' is not a state dict/,
        "a model that is not a state dict",
      );
      assert.ok(!(await Deno.stat(out).then(() => true, () => false)), "nothing written");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("to_halfstep.py: a checkpoint carrying a pickled payload is refused in one line and the payload never runs (zip and legacy formats)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    for (const format of ["zip", "legacy"]) {
      const path = join(dir, `payload-${format}.pt`), marker = join(dir, `ran-${format}`);
      await runTorchScript("pickled_payload_checkpoint.py", [
        path,
        marker,
        ...(format === "legacy" ? ["legacy"] : []),
      ]);
      const out = join(dir, `run-${format}.safetensors`);
      const r = await tool("to_halfstep.py", [path, out, "--optimizer", "AdamW"]);
      assert.ok(!(await exists(marker)), `${format}: the payload ran (os.mkdir made ${marker})`);
      assertOneLine(
        r,
        1,
        /^to_halfstep: .*payload-\w+\.pt: refused: loading it would call posix\.mkdir, which is not a tensor/,
        format,
      );
      assert.ok(!(await exists(out)), `${format}: nothing written`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("continue_ddp.py and to_halfstep.py: an output replaces a file only with --overwrite, never their input, and its folder is checked before any work; to_halfstep says what it wrote", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const checkpoint = join(dir, "ckpt.pt");
    await runTorchScript("adamw_cosine_checkpoint.py", [checkpoint, "{}"]);
    const run = join(dir, "run.safetensors"), old = join(dir, "old.safetensors");
    await Deno.writeTextFile(old, "a continued run at step 400");
    const convert = ["--optimizer", "AdamW", "--schedule", "cosine:warmup=20,total=400"];
    const before = await Deno.readFile(checkpoint);
    const converted = await tool("to_halfstep.py", [checkpoint, run, ...convert]);
    assert.equal(converted.code, 0, converted.stderr);
    assert.match(
      converted.stdout,
      /^to_halfstep: wrote .*run\.safetensors \(a halfstep training run at step 3, AdamW; loadTrainingState resumes it\)$/m,
    );
    const cases: [string, string, string[], RegExp][] = [
      [
        "to_halfstep onto an existing file",
        "to_halfstep.py",
        [checkpoint, old, ...convert],
        /^to_halfstep: OUT .*old\.safetensors already exists; add --overwrite to replace it, or give another path$/,
      ],
      [
        "to_halfstep onto its own input",
        "to_halfstep.py",
        [checkpoint, checkpoint, ...convert, "--overwrite"],
        /^to_halfstep: OUT .*ckpt\.pt is the file of CHECKPOINT, which this run reads/,
      ],
      [
        "continue_ddp --save over a run",
        "continue_ddp.py",
        [run, "--save", old, "--procs", "1"],
        /^continue_ddp: --save .*old\.safetensors already exists; add --overwrite/,
      ],
      [
        "continue_ddp --save onto the run it reads",
        "continue_ddp.py",
        [run, "--save", run, "--overwrite", "--procs", "1"],
        /^continue_ddp: --save .*run\.safetensors is the file of the run, which this run reads/,
      ],
      [
        "continue_ddp --save into a missing folder",
        "continue_ddp.py",
        [run, "--save", join(dir, "no", "such", "c.safetensors"), "--procs", "1"],
        /^continue_ddp: --save .*c\.safetensors: the folder .*no\/such does not exist; create it first$/,
      ],
      [
        "continue_ddp --log over a log",
        "continue_ddp.py",
        [run, "--log", join(dir, "old"), "--procs", "1"],
        /^continue_ddp: --log .*old\.rank0\.jsonl already exists/,
      ],
    ];
    await Deno.writeTextFile(join(dir, "old.rank0.jsonl"), "{}\n");
    for (const [what, script, args, message] of cases) {
      const started = performance.now();
      assertOneLine(await tool(script, args), 2, message, what);
      // Refused before any work: no process started, no step trained (a second, not minutes).
      assert.ok(performance.now() - started < 60_000, `${what}: refused at once`);
    }
    assert.equal(await Deno.readTextFile(old), "a continued run at step 400", "the run is kept");
    assert.deepEqual(await Deno.readFile(checkpoint), before, "the checkpoint is kept");
    const over = await tool("to_halfstep.py", [checkpoint, old, ...convert, "--overwrite"]);
    assert.equal(over.code, 0, over.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** CpuGradScaler through an overflowing step and two clean ones: what it did, as JSON. */
const CPU_SCALER = `
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from halfstep_run import CpuGradScaler
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = CpuGradScaler(init_scale=2.0 ** 16, growth_interval=2)
weights = lambda: [p.detach().clone() for p in model.parameters()]
def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))
out = {}
for bad in (float("inf"), float("-inf"), float("nan")):
    before = weights()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
        p.grad.view(-1)[0] = bad
    scaler.step(optimizer)
    scaler.update()
    out[str(bad)] = {"kept": same(before, weights()), **scaler.state_dict()}
before = weights()
for _ in range(2):
    optimizer.zero_grad()
    scaler.scale(model(torch.ones(1, 3)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
out["clean"] = {"kept": same(before, weights()), **scaler.state_dict()}
print(json.dumps(out))
`;

Deno.test("CpuGradScaler (continue_ddp.py's loss scaler on CPUs): an inf, -inf or NaN gradient skips the step, weights untouched, and halves the scale; clean steps grow it after growth_interval, as torch.cuda.amp.GradScaler does", async () => {
  const out = JSON.parse(await runPython(["-c", CPU_SCALER, TOOLS]));
  const state = (scale: number, tracker: number, kept: boolean) => ({
    kept,
    scale,
    growth_factor: 2,
    backoff_factor: 0.5,
    growth_interval: 2,
    _growth_tracker: tracker,
  });
  assert.deepEqual(out.inf, state(32768, 0, true), "inf: skipped, backed off");
  assert.deepEqual(out["-inf"], state(16384, 0, true), "-inf: skipped, backed off");
  assert.deepEqual(out.nan, state(8192, 0, true), "NaN: skipped, backed off");
  assert.deepEqual(out.clean, state(16384, 0, false), "two clean steps: stepped, grown once");
});

/** Whether something is at `path`. */
function exists(path: string): Promise<boolean> {
  return Deno.lstat(path).then(() => true, () => false);
}

/** write_safetensors through a link, then failing at fsync: what is left. */
const WRITE_THROUGH_LINK = `
import json, os, sys, torch
sys.path.insert(0, sys.argv[1])
from safetensors_file import read_safetensors, write_safetensors
folder = sys.argv[2]
target, link = os.path.join(folder, "target.safetensors"), os.path.join(folder, "link.safetensors")
write_safetensors(target, {"w": torch.ones(2)}, {})
os.symlink(target, link)
write_safetensors(link, {"w": torch.zeros(2)}, {})
def full_disk(fd):
    raise OSError(28, "No space left on device")
os.fsync = full_disk
try:
    write_safetensors(link, {"w": torch.full((2,), 5.0)}, {})
    failed = False
except OSError:
    failed = True
print(json.dumps({"failed": failed, "link": os.path.islink(link), "files": sorted(os.listdir(folder)),
                  "w": read_safetensors(target)[0]["w"].tolist()}))
`;

Deno.test("write_safetensors (Python): a symbolic link stays one, its file is replaced; a failed write leaves no temporary and the file as it was", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const printed = JSON.parse(await runPython(["-c", WRITE_THROUGH_LINK, TOOLS, dir]));
    assert.deepEqual(printed, {
      failed: true,
      link: true,
      files: ["link.safetensors", "target.safetensors"],
      w: [0, 0],
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
