/**
 * A long poll parked through the real task service, for tests of what wakes it: its rescan comes
 * a minute later, so before its wait runs out only a wake hint answers it.
 */
import type { AcquireCommand, AcquireReply } from '@ledgence/contracts';
import {
  type AcquireOutcome,
  type AcquireStoreOptions,
  createTaskService,
  type TaskStore,
  type WakeSource,
} from '@ledgence/core';

/** A poll under way: its first probe (the one that parks it, when empty), and its answer. */
export interface ParkedPoll {
  readonly probed: Promise<AcquireOutcome>;
  readonly answered: Promise<AcquireReply>;
}

/** Sends `command` as a long poll of `waitMs` through a service over `store` and `wake`. */
export function parkedPoll(
  store: TaskStore,
  wake: WakeSource,
  command: AcquireCommand,
  waitMs: number,
): ParkedPoll {
  let reportProbe: (outcome: AcquireOutcome) => void = () => {};
  const probed = new Promise<AcquireOutcome>((resolve) => {
    reportProbe = resolve;
  });
  const observed = new Proxy(store, {
    get(target, property) {
      if (property === 'acquire') {
        return async (polled: AcquireCommand, options: AcquireStoreOptions) => {
          const outcome = await target.acquire(polled, options);
          reportProbe(outcome);
          return outcome;
        };
      }
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  const service = createTaskService({
    store: observed,
    wake,
    rescanIntervalMs: 60_000,
    longPollMaxMs: 20_000,
  });
  return { probed, answered: service.acquire(command, { waitMs }) };
}
