/**
 * Ctrl-C in the terminal running the server the way the README starts it
 * (`pnpm start`). README "Running the server": "SIGTERM, SIGINT (Ctrl-C) and SIGHUP ... stop it
 * gracefully: not ready, stop accepting, parked long polls end with `empty`, in-flight requests
 * finish ... a second signal exits at once." A terminal's Ctrl-C signals the whole foreground
 * process group — pnpm, the `sh -c` running the script, and the server — and pnpm also forwards
 * the SIGINT it got to its script, so the server may hear Ctrl-C more than once.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stack, sleep } from './test/harness.js';
import { parkedPoll } from './test/wire.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The pinned pnpm CI installs (`.ci/run`), the version the README's `npx pnpm@… start` runs. */
const pnpm = join(root, '.ci', '.tools', 'node_modules', 'pnpm', 'bin', 'pnpm.cjs');

const stack = new Stack('ctrl_c_pnpm');
let child: ChildProcess | undefined;

beforeAll(async () => {
  await stack.open();
});
afterAll(async () => {
  if (child?.pid !== undefined && child.exitCode === null) {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  await stack.close();
});

// Skipped where the pinned pnpm is not in .ci/.tools: .ci/run installs it there; a checkout run
// with the README's `npx --yes pnpm@…` keeps it only in npx's cache, at no path known here.
describe.skipIf(!existsSync(pnpm))(
  'Ctrl-C in a terminal running `pnpm start` (apps/server)',
  () => {
    it('stops gracefully: a parked poll is answered empty, no "exiting now"', async () => {
      child = spawn(process.execPath, [pnpm, 'start'], {
        cwd: join(root, 'apps', 'server'),
        env: {
          ...process.env,
          DATABASE_URL: stack.databaseUrl,
          PORT: '0',
          LEDGENCE_LOG_LEVEL: 'warn',
          LEDGENCE_LONG_POLL_WAIT_MS: '60000',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true, // a process group of its own, as a shell job is
      });
      let output = '';
      child.stdout?.setEncoding('utf8').on('data', (c: string) => {
        output += c;
      });
      child.stderr?.setEncoding('utf8').on('data', (c: string) => {
        output += c;
      });
      const exited = new Promise<number | string>((done) =>
        child?.once('exit', (code, signal) => done(code ?? signal ?? 'unknown')),
      );
      const url = await new Promise<string>((done, fail) => {
        const timer = setInterval(() => {
          const match = /listening on (http:\/\/\S+)/.exec(output);
          if (match?.[1] !== undefined) {
            clearInterval(timer);
            done(match[1]);
          }
        }, 50);
        void exited.then(() => {
          clearInterval(timer);
          fail(new Error(`exited before listening:\n${output}`));
        });
      });
      const parked = parkedPoll(url, 'idle', 60_000).catch((error: unknown) => ({
        status: 0,
        reply: String(error),
      }));
      await sleep(1_500); // parked by now

      process.kill(-(child.pid as number), 'SIGINT'); // Ctrl-C

      const reply = await parked;
      await exited;
      await sleep(200);
      expect(output).not.toMatch(/again: exiting now/);
      expect(reply).toMatchObject({ status: 200, reply: { disposition: 'empty' } });
      expect(output).toMatch(/SIGINT: shutting down gracefully/);
    }, 120_000);
  },
);
