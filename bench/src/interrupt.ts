/**
 * What an interrupted benchmark does. The Ledgence server and the embedded PostgreSQL are child
 * processes of the benchmark; Ctrl-C in a terminal signals the whole process group, so they stop
 * on their own, but a signal sent to the benchmark alone (`kill`, `pkill -f run.ts`, a CI
 * timeout) used to leave both running, holding the data folder the next run needs.
 */
import { constants } from 'node:os';

const SIGNALS = ['SIGINT', 'SIGTERM'] as const;

/** Options of {@link stopOnSignals}. */
export interface StopOnSignalsOptions {
  /** What the teardown stops, for the message the interruption prints. */
  readonly what: string;
  readonly log: (message: string) => void;
  /** Ends the process; `process.exit` unless a test passes its own. */
  readonly exit?: (code: number) => void;
  /** Where the signals arrive; `process` unless a test passes its own. */
  readonly source?: NodeJS.EventEmitter;
}

/** The handlers {@link stopOnSignals} installed. */
export interface SignalStop {
  /** The signal that interrupted the run, or `undefined` while none has. */
  readonly signal: NodeJS.Signals | undefined;
  /** Removes the handlers. */
  dispose(): void;
}

/**
 * On SIGINT or SIGTERM, runs `teardown` and then exits with the shell's code for that signal
 * (128 + its number: 130, 143), so a caller still sees the run as killed. A second signal while
 * the teardown runs exits at once: someone who presses Ctrl-C twice means it.
 *
 * @param teardown stops what the run started; it must be safe to call again from the run's own
 *   `finally` (the run goes on while the teardown stops its server under it).
 */
export function stopOnSignals(
  teardown: () => Promise<void>,
  options: StopOnSignalsOptions,
): SignalStop {
  const exit = options.exit ?? ((code: number) => process.exit(code));
  const source: NodeJS.EventEmitter = options.source ?? process;
  let signal: NodeJS.Signals | undefined;
  const handle = (received: NodeJS.Signals): void => {
    const code = 128 + constants.signals[received];
    if (signal !== undefined) {
      exit(code);
      return;
    }
    signal = received;
    options.log(`${received}: stopping ${options.what} (${received} again exits at once)`);
    teardown().then(
      () => exit(code),
      (error: unknown) => {
        options.log(`stopping after ${received} failed: ${String(error)}`);
        exit(code);
      },
    );
  };
  for (const name of SIGNALS) source.on(name, handle);
  return {
    get signal() {
      return signal;
    },
    dispose() {
      for (const name of SIGNALS) source.off(name, handle);
    },
  };
}

/** `fn` run at most once: every call after the first returns the first call's promise. */
export function once(fn: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | undefined;
  return () => {
    running ??= fn();
    return running;
  };
}
