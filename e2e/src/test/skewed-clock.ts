/**
 * Server processes whose wall clock is wrong, for the tests that hold the server to store time
 * (DESIGN §1.2). A module preloaded through `NODE_OPTIONS` makes `Date` and `Date.now` read the
 * real clock plus an offset, and each SIGUSR2 adds a step to the offset (a clock stepped by NTP
 * while the process runs), saying so on stderr. Timers and `performance.now()` stay monotonic and
 * untouched, as on a machine whose wall clock is stepped.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll } from 'vitest';
import type { ServerProcess } from '../server-process.js';
import { until } from './harness.js';

const SKEW_MODULE = `
const Real = globalThis.Date;
const realNow = Real.now.bind(Real);
let offset = Number(process.env.SKEW_CLOCK_OFFSET_MS ?? '0');
const step = Number(process.env.SKEW_CLOCK_STEP_MS ?? '0');
function Skewed(...args) {
  if (new.target === undefined) return new Real(realNow() + offset).toString();
  return args.length === 0 ? new Real(realNow() + offset) : new Real(...args);
}
Skewed.prototype = Real.prototype;
Skewed.now = () => realNow() + offset;
Skewed.parse = Real.parse;
Skewed.UTC = Real.UTC;
globalThis.Date = Skewed;
process.stderr.write('skewed-clock: process clock reads ' + Date.now() + '\\n');
process.on('SIGUSR2', () => {
  offset += step;
  process.stderr.write('skewed-clock: offset now ' + offset + '\\n');
});
`;

/** The file's skewed clocks: the environment that sets one up, and its readings and steps. */
export interface SkewedClocks {
  /** Environment preloading the module with `offsetMs`, and a SIGUSR2 step of `stepMs`. */
  env(offsetMs: number, stepMs?: number): Record<string, string>;
  /** The process clock `server` read when it started (ms since the epoch). */
  reading(server: ServerProcess): number;
  /** Steps `server`'s process clock by its step and waits until it has. */
  step(server: ServerProcess): Promise<void>;
}

/** Writes the module before the file's tests (`beforeAll`) and removes it after them. */
export function skewedClocks(): SkewedClocks {
  let dir = '';
  let url = '';
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'ledgence-skewed-clock-'));
    const file = join(dir, 'skew.mjs');
    writeFileSync(file, SKEW_MODULE);
    url = pathToFileURL(file).href;
  });
  afterAll(() => {
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });
  const steps = (server: ServerProcess) =>
    (server.stderr().match(/skewed-clock: offset now/g) ?? []).length;
  return {
    env: (offsetMs, stepMs = 0) => ({
      NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${url}`.trim(),
      SKEW_CLOCK_OFFSET_MS: String(offsetMs),
      SKEW_CLOCK_STEP_MS: String(stepMs),
    }),
    reading: (server) =>
      Number(/skewed-clock: process clock reads (\d+)/.exec(server.stderr())?.[1]),
    async step(server) {
      const seen = steps(server);
      server.child.kill('SIGUSR2');
      await until(() => steps(server) > seen, 10_000, 'the clock step');
    },
  };
}
