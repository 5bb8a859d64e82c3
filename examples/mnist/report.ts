/**
 * What `mnist.ts` prints at the start and at the end of a run: the `start`
 * event, the `--plot` chart and the `final` event, as text or (with --json)
 * one JSON object a line.
 *
 * @module
 */
import { tilingNames } from "../../gpu/mod.ts";
import type { Run, Tally } from "./run.ts";
import { writeLossChart } from "../plots/loss_chart.ts";
import { precisionDetail, precisionName } from "../cli/amp_flag.ts";
import { backendNote } from "../cli/backend_flag.ts";
import { mnistStepFlops } from "../bench/flops.ts";

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

/** The `start` event: the adapter, the data and the run's settings. */
export function reportStart(
  run: Pick<Run, "cfg" | "emit" | "gpu" | "train" | "test" | "batch" | "stepsPerEpoch">,
  seconds: { loadSeconds: number; initSeconds: number },
): void {
  const { cfg, gpu, train, test, batch, stepsPerEpoch } = run;
  const { loadSeconds, initSeconds } = seconds;
  run.emit(
    "start",
    {
      adapter: gpu.adapterName,
      f16: gpu.f16,
      matmulTilings: tilingNames(gpu),
      trainCount: train.count,
      testCount: test.count,
      ...cfg,
      backend: gpu.backend,
      subgroupMatrixConfigs: gpu.subgroupMatrixConfigs,
      batch,
      stepsPerEpoch,
      loadSeconds,
      initSeconds,
    },
    [
      `adapter: ${gpu.adapterName}${backendNote(gpu)}; matmul tilings: ${
        Object.entries(tilingNames(gpu)).map(([c, t]) => `${c} ${t}`).join(", ")
      }`,
      `MNIST: ${train.count} train / ${test.count} test images (loaded in ${
        loadSeconds.toFixed(2)
      } s); GPU ready in ${initSeconds.toFixed(2)} s`,
      `${MODEL_NAMES[cfg.model]}, ${
        precisionDetail(cfg.amp, cfg.ampDtype)
      }, ${cfg.optimizer} lr ${cfg.lr}` +
      `${cfg.optimizer === "sgd" ? ` momentum ${cfg.momentum}` : ""}, batch ${batch}${
        cfg.accum > 1 ? ` × ${cfg.accum} accumulated` : ""
      }, ` +
      `${cfg.epochs} epoch(s) × ${stepsPerEpoch} steps, seed ${cfg.seed}`,
    ].join("\n"),
  );
}

/**
 * "allocated between steps: after step 10 3990016 B, ..." for the steps this
 * session measured (a short or resumed run may have passed none of 10 and 200).
 */
function allocatedLine(after: ReadonlyMap<number, number>): string {
  const measured = [...after].sort(([a], [b]) => a - b).map(([s, bytes]) =>
    `after step ${s} ${bytes} B`
  );
  return `allocated between steps: ${measured.join(", ") || "no step ran in this session"}`;
}

/** How the start line names each model. */
const MODEL_NAMES = {
  mlp: "MLP 784-256-256-10",
  cnn: "CNN conv32-conv64 (BatchNorm fp32)",
};

/** Writes the `--plot` chart of the logged losses and loss scales. */
export async function writePlot(run: Run, tally: Tally): Promise<void> {
  const { cfg } = run;
  if (!cfg.plot) return;
  const title = `MNIST ${cfg.model.toUpperCase()}, ${
    precisionName(cfg.amp, cfg.ampDtype)
  }, ${cfg.optimizer}`;
  await writeLossChart(cfg.plot, { title, points: tally.plotPoints });
}

/**
 * Writes `--plot`, then the `final` event (the last line): test accuracy,
 * loss scale, speed, GPU memory and work. Reads the loss scaler (sync points,
 * once at the end).
 */
export async function report(run: Run, tally: Tally, started: number): Promise<void> {
  const { cfg, gpu, trainer } = run;
  const { step, lastLoss, testAccuracy, trainSeconds, trainPeak, evalPeak } = tally;
  const lossScale = await trainer.scaler.getScale();
  const skippedSteps = await trainer.scaler.skippedSteps();
  const memory = gpu.memoryStats();
  const peakBytes = Math.max(trainPeak, evalPeak, memory.peakBytes);
  const wallSeconds = (performance.now() - started) / 1000;
  // This session's steps only (a resumed run trained the others before).
  const sessionSteps = step - tally.sessionStart;
  const stepsPerSecond = sessionSteps > 0 ? sessionSteps / trainSeconds : null;
  const flopsPerStep = mnistStepFlops(cfg.model, run.batch);
  // Live GPU memory between steps (for information; tests/gpu/device/memory_test.ts checks it stays flat).
  const allocated10 = tally.allocatedAfter.get(10) ?? null;
  const allocated200 = tally.allocatedAfter.get(200) ?? null;
  const allocatedLast = tally.allocatedAfter.get(step) ?? null;
  const counters = gpu.batch.counters;
  const capture = run.step.stats();
  if (cfg.plot) run.emit("plot", { path: cfg.plot }, `wrote ${cfg.plot}`); // before `final`
  run.emit(
    "final",
    {
      lossScale,
      skippedSteps,
      optimizerSteps: trainer.steps,
      amp: trainer.masters !== null,
      testAccuracy,
      steps: step,
      epochs: cfg.epochs,
      finalLoss: lastLoss,
      peakBytes,
      trainPeakBytes: trainPeak,
      evalPeakBytes: evalPeak,
      allocatedBytes: memory.allocatedBytes,
      reservedBytes: memory.reservedBytes,
      allocatedAfterStep10: allocated10,
      allocatedAfterStep200: allocated200,
      allocatedAfterLastStep: allocatedLast,
      trainSeconds,
      sessionSteps,
      stepsPerSecond,
      gflops: stepsPerSecond === null ? null : (flopsPerStep * stepsPerSecond) / 1e9,
      wallSeconds,
      dispatches: counters.dispatches,
      submits: counters.submits,
      reads: counters.reads,
      ...capture,
      adapter: gpu.adapterName,
    },
    [
      `test accuracy: ${(testAccuracy * 100).toFixed(2)}% after ${step} steps` +
      (Number.isNaN(lastLoss) ? "" : ` (final loss ${lastLoss.toFixed(4)})`),
      `loss scale: ${lossScale}${
        trainer.masters ? "" : " (AMP off)"
      }, skipped steps: ${skippedSteps}`,
      stepsPerSecond === null
        ? `training: no steps ran in this session; wall time ${wallSeconds.toFixed(1)} s`
        : `training: ${sessionSteps} steps in ${trainSeconds.toFixed(1)} s, ${
          stepsPerSecond.toFixed(2)
        } steps/s, ${
          ((flopsPerStep * stepsPerSecond) / 1e9).toFixed(2)
        } GFLOP/s effective; wall time ${wallSeconds.toFixed(1)} s`,
      `GPU memory: peak ${mib(peakBytes)} (training ${mib(trainPeak)}, evaluation ${
        mib(evalPeak)
      }), allocated now ${mib(memory.allocatedBytes)}, ` +
      `reserved ${mib(memory.reservedBytes)}`,
      allocatedLine(tally.allocatedAfter),
      `GPU work: ${counters.dispatches} dispatches, ${counters.submits} submits, ${counters.reads} reads`,
      capture.captured
        ? `captured step: ${capture.replayedSteps} of ${sessionSteps} steps replayed`
        : "uncaptured step (--no-capture or --inspect)",
    ].join("\n"),
  );
}
