import { availableParallelism } from 'node:os';
import { defaultServerConditions } from 'vite';
import { defineConfig } from 'vitest/config';

// Tests sit beside the code: `*.test.ts` are fast unit tests with no I/O,
// `*.int.test.ts` talk to a real PostgreSQL, `*.e2e.test.ts` drive real
// processes over real sockets. The `@ledgence/source` condition resolves
// workspace packages to their TypeScript sources, so no build is needed.
// Vite applies `resolve.conditions` to browser code only; tests run on the server side, whose
// conditions are `ssr.resolve.conditions` — without it, imports fall through to stale `dist/`.
const shared = {
  resolve: { conditions: ['@ledgence/source'] },
  ssr: { resolve: { conditions: ['@ledgence/source', ...defaultServerConditions] } },
};

// Int and e2e tests share one PostgreSQL per run: `DATABASE_URL` if set, else embedded
// PostgreSQL in .ledgence/test-pg; each test file makes its own database on it.
const pgSetup = 'packages/store-postgres/src/testing/global-setup.ts';

// CI asks for a machine-readable report beside the console output, to count
// passed and failed tests from it rather than from scraped text.
const report = process.env.LEDGENCE_TEST_REPORT;

export default defineConfig({
  test: {
    reporters: report ? ['default', ['json', { outputFile: report }]] : ['default'],
    // Vitest 4 runs as many files at once as the machine's available parallelism less one: one
    // at a time on a 2-core machine. Int and e2e files spend most of their time waiting on
    // leases, long polls and other processes (each file has its own database), so at least two
    // run at once: on this project's 2-core machine `pnpm test` took 11 minutes instead of 16.
    maxWorkers: Math.max(2, availableParallelism() - 1),
    projects: [
      {
        ...shared,
        test: {
          name: 'unit',
          include: ['{packages,apps,scripts,bench,reliability}/**/*.test.{ts,mjs}'],
          // `*.chaos.test.ts` load the machine: only the `chaos` project runs them.
          exclude: [
            '**/node_modules/**',
            '**/dist/**',
            '**/*.int.test.ts',
            '**/*.e2e.test.ts',
            '**/*.chaos.test.ts',
          ],
        },
      },
      {
        ...shared,
        test: {
          name: 'int',
          include: ['{packages,apps,reliability}/**/*.int.test.ts'],
          exclude: ['**/node_modules/**', '**/dist/**', '**/*.chaos.test.ts'],
          globalSetup: [pgSetup],
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        ...shared,
        test: {
          name: 'e2e',
          include: ['{packages,apps,e2e,bench}/**/*.e2e.test.ts'],
          exclude: ['**/node_modules/**', '**/dist/**'],
          globalSetup: [pgSetup],
          testTimeout: 120_000,
          hookTimeout: 120_000,
        },
      },
      {
        ...shared,
        // `pnpm test:chaos`: crash, fault and bad-input suites with real processes. Run on their
        // own (not by `pnpm test`): they load the machine, and must not starve other tests.
        test: {
          name: 'chaos',
          include: ['reliability/**/*.chaos.test.ts'],
          exclude: ['**/node_modules/**', '**/dist/**'],
          globalSetup: [pgSetup],
          testTimeout: 420_000,
          hookTimeout: 180_000,
          // One suite at a time: each measures its own figures on a quiet machine.
          fileParallelism: false,
        },
      },
    ],
  },
});
