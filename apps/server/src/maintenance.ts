import { MAX_RECOVERY_BATCH, type RecoveryProgress } from '@ledgence/contracts';
import type { Logger } from 'pino';

/** Options of {@link startMaintenance}. */
export interface MaintenanceOptions {
  /** One bounded recovery pass (the service's `recoverExpiredLeases`). */
  recover(limit: number): Promise<RecoveryProgress>;
  /** Pause between rounds. */
  intervalMs: number;
  logger: Logger;
  /** Called with each pass's progress (metrics). */
  onProgress?: (progress: RecoveryProgress) => void;
}

/** A running maintenance loop. */
export interface Maintenance {
  /** Stops the loop after the pass in progress, if any, has committed. */
  stop(): Promise<void>;
}

/**
 * Runs lease recovery on this replica every `intervalMs`: passes of at most
 * MAX_RECOVERY_BATCH in bounded transactions, repeated while a pass was full.
 * Every replica runs it at once; the store's SKIP LOCKED leasing makes that
 * safe without a leader. A failed pass is logged and retried next round.
 */
export function startMaintenance(options: MaintenanceOptions): Maintenance {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> = Promise.resolve();

  async function round(): Promise<void> {
    try {
      for (;;) {
        const progress = await options.recover(MAX_RECOVERY_BATCH);
        options.onProgress?.(progress);
        if (progress.recovered > 0) options.logger.info({ progress }, 'recovered expired leases');
        if (!progress.has_more || stopped) break;
      }
    } catch (error) {
      options.logger.warn({ err: error }, 'lease recovery pass failed; retrying next round');
    }
  }

  function schedule(): void {
    if (stopped) return;
    timer = setTimeout(() => {
      running = round().finally(schedule);
    }, options.intervalMs);
    timer.unref();
  }
  schedule();

  return {
    async stop() {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      await running;
    },
  };
}
