import { defineConfig } from 'vitest/config';

// Tests sit beside the code: `*.test.ts` are fast unit tests with no I/O,
// `*.int.test.ts` talk to a real PostgreSQL, `*.e2e.test.ts` drive real
// processes over real sockets. The `@ledgence/source` condition resolves
// workspace packages to their TypeScript sources, so no build is needed.
const shared = {
  resolve: { conditions: ['@ledgence/source'] },
};

export default defineConfig({
  test: {
    projects: [
      {
        ...shared,
        test: {
          name: 'unit',
          include: ['{packages,apps,scripts}/**/*.test.{ts,mjs}'],
          exclude: ['**/node_modules/**', '**/dist/**', '**/*.int.test.ts', '**/*.e2e.test.ts'],
        },
      },
      {
        ...shared,
        test: {
          name: 'int',
          include: ['{packages,apps}/**/*.int.test.ts'],
          exclude: ['**/node_modules/**', '**/dist/**'],
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        ...shared,
        test: {
          name: 'e2e',
          include: ['{packages,apps}/**/*.e2e.test.ts'],
          exclude: ['**/node_modules/**', '**/dist/**'],
          testTimeout: 120_000,
          hookTimeout: 120_000,
        },
      },
    ],
  },
});
