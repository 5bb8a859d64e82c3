/**
 * What `tiny_gpt.ts` prints at the start and at the end of a run: the `start`
 * event, the `--plot` chart and the `final` event, as text or (with --json)
 * one JSON object a line.
 *
 * @module
 */
import type { Run, Training } from "./run.ts";
import { writeLossChart } from "../plots/loss_chart.ts";
import { precisionDetail, precisionName } from "../cli/amp_flag.ts";
import { backendNote } from "../cli/backend_flag.ts";

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

/** The `start` event: the adapter, the data, the model and the run's settings. */
export function reportStart(
  run: Omit<Run, "optimizer" | "trainer" | "step" | "profile">,
  setupSeconds: number,
): void {
  const { cfg: c, corpus, windows, bigram, gpu } = run;
  const parameters = run.model.parameters().reduce((n, p) => n + p.size, 0);
  run.emit(
    "start",
    {
      adapter: gpu.adapterName,
      f16: gpu.f16,
      ...c,
      backend: gpu.backend,
      subgroupMatrixConfigs: gpu.subgroupMatrixConfigs,
      vocab: corpus.vocab.length,
      parameters,
      trainChars: corpus.train.length,
      validationWords: corpus.validationWords,
      validationChars: windows.count * c.context,
      bigramLoss: bigram,
      setupSeconds,
    },
    [
      `adapter: ${gpu.adapterName}${backendNote(gpu)}; ` +
      `${c.data ? `${c.data}, lines` : "words"}: ` +
      `${corpus.trainWords.size} train / ${corpus.validationWords} ` +
      `held out (${corpus.train.length} training characters, vocab ${corpus.vocab.length})`,
      `GPT: ${c.layers} blocks, dim ${c.dim}, ${c.heads} heads, context ${c.context}, ` +
      `${parameters} parameters; ${precisionDetail(c.amp, c.ampDtype)}` +
      `${
        c.checkpoint ? ", checkpointed blocks" : ""
      }; AdamW lr ${c.lr}, batch ${c.batch}, ${c.steps} steps`,
      `bigram baseline (add-one, from the training split): ${bigram.toFixed(4)} nats/char on ` +
      `${windows.count * c.context} validation characters`,
    ].join("\n"),
  );
}

/**
 * Writes `--plot`, then the `final` event (the last line): validation loss
 * against the bigram baseline, speed, memory, loss scale and the samples.
 */
export async function report(
  run: Run,
  training: Training,
  evaluation: { validation: number; evalSeconds: number; samples: string[] },
  started: number,
): Promise<void> {
  const { cfg: c, trainer, bigram } = run;
  const { lastLoss, trainSeconds, trainPeak } = training;
  const { validation, evalSeconds, samples } = evaluation;
  const novel = samples.filter((w) => !run.corpus.trainWords.has(w)).length;
  const lossScale = await trainer.scaler.getScale(), skipped = await trainer.scaler.skippedSteps();
  const wallSeconds = (performance.now() - started) / 1000;
  const final = {
    validationLoss: validation,
    bigramLoss: bigram,
    improvement: bigram - validation,
    finalTrainLoss: lastLoss,
    steps: c.steps,
    stepsPerSecond: c.steps / trainSeconds,
    tokensPerSecond: (c.steps * c.batch * c.context) / trainSeconds,
    trainSeconds,
    evalSeconds,
    wallSeconds,
    peakBytes: trainPeak,
    amp: trainer.masters !== null,
    checkpoint: c.checkpoint,
    lossScale,
    skippedSteps: skipped,
    samples,
    novelSamples: novel,
    ...run.step.stats(),
  };
  if (c.plot) {
    await writeLossChart(c.plot, {
      title: `tiny GPT (${c.layers} blocks, dim ${c.dim}), ${precisionName(c.amp, c.ampDtype)}`,
      points: training.plotPoints,
      // Validation runs once, after the last step; the bigram model is the bar to beat.
      validation: [{ step: c.steps, loss: validation }],
      baseline: { label: "bigram baseline", loss: bigram },
    });
    run.emit("plot", { path: c.plot }, `wrote ${c.plot}`);
  }
  run.emit(
    "final",
    final,
    [
      `validation loss ${validation.toFixed(4)} nats/char vs bigram ${bigram.toFixed(4)} ` +
      `(${(bigram - validation).toFixed(4)} better); final train loss ${lastLoss.toFixed(4)}`,
      `${final.stepsPerSecond.toFixed(2)} steps/s (${
        final.tokensPerSecond.toFixed(0)
      } tokens/s), ` +
      `training ${trainSeconds.toFixed(1)} s, evaluation ${evalSeconds.toFixed(2)} s, wall ${
        wallSeconds.toFixed(1)
      } s`,
      `peak GPU memory in training: ${mib(trainPeak)}; loss scale ${lossScale}, ` +
      `${skipped} skipped steps`,
      `samples (temperature ${c.temperature}; ${novel}/${samples.length} not in the training words): ` +
      samples.join(", "),
    ].join("\n"),
  );
}
