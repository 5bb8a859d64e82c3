/**
 * `mnist.ts`'s evaluation: test accuracy and the mean test loss after an
 * epoch, with a progress bar while it runs.
 *
 * @module
 */
import { noGrad, Tensor, tidy } from "../../mod.ts";
import { Progress } from "../cli/progress.ts";
import type { Run, Tally } from "./run.ts";
import { MNIST_CLASSES, MNIST_PIXELS } from "../data/mnist.ts";
import { mnistInputShape } from "./model.ts";

/**
 * Test accuracy after `epoch`: reads the logits back once per `--eval-batch`
 * images and takes the argmax on the CPU. The pool's peak is reset around it,
 * so that the peaks of training and of evaluation are measured apart.
 */
export async function evaluate(run: Run, tally: Tally, epoch: number): Promise<void> {
  const { gpu, model, test } = run, batch = run.cfg.evalBatch;
  const progress = new Progress(!run.cfg.json);
  if (!progress.isBar) {
    run.emit(
      "phase",
      { phase: "evaluate", epoch },
      `epoch ${epoch}: evaluating ${test.count} test images...`,
    );
  }
  const evalStart = performance.now();
  tally.trainPeak = Math.max(tally.trainPeak, gpu.memoryStats().peakBytes);
  gpu.resetPeakMemory();
  let correct = 0, lossSum = 0;
  for (let from = 0; from < test.count; from += batch) {
    const n = Math.min(batch, test.count - from);
    const x = test.images.subarray(from * MNIST_PIXELS, (from + n) * MNIST_PIXELS);
    const shape = mnistInputShape(run.cfg.model, n);
    const logits = noGrad(() => tidy(() => model.forward(Tensor.from(x, shape))));
    const values = await logits.read();
    logits.dispose();
    for (let i = 0; i < n; i++) {
      const row = values.subarray(i * MNIST_CLASSES, (i + 1) * MNIST_CLASSES);
      let best = 0;
      for (let c = 1; c < MNIST_CLASSES; c++) if (row[c] > row[best]) best = c;
      if (best === test.labels[from + i]) correct++;
      lossSum += crossEntropyOf(row, test.labels[from + i]);
    }
    progress.update(from + n, test.count, `evaluating epoch ${epoch} (test images)`);
  }
  progress.finish();
  tally.testAccuracy = correct / test.count;
  tally.testLoss = lossSum / test.count;
  tally.evalPeak = Math.max(tally.evalPeak, gpu.memoryStats().peakBytes);
  gpu.resetPeakMemory();
  const now = performance.now();
  const evalSeconds = (now - evalStart) / 1000, secondsSinceStart = (now - run.started) / 1000;
  run.emit(
    "eval",
    {
      epoch,
      step: tally.step,
      testAccuracy: tally.testAccuracy,
      testLoss: tally.testLoss,
      evalSeconds,
      secondsSinceStart,
    },
    `epoch ${epoch}: test accuracy ${(tally.testAccuracy * 100).toFixed(2)}% ` +
      `(evaluated in ${evalSeconds.toFixed(2)} s; ${secondsSinceStart.toFixed(1)} s since start)`,
  );
}

/** −log softmax(logits)[label] in f64: NaN when a logit is not finite. */
function crossEntropyOf(logits: ArrayLike<number>, label: number): number {
  let max = -Infinity, sum = 0;
  for (let c = 0; c < logits.length; c++) max = Math.max(max, logits[c]);
  for (let c = 0; c < logits.length; c++) sum += Math.exp(logits[c] - max);
  return max + Math.log(sum) - logits[label];
}
