import { join, normalize } from 'node:path';
import { describe, expect, it } from 'vitest';
import { findViolations, importSpecifiers, packageOf } from './dependency-rules.mjs';

const resolve = (dir, path, specifier) => normalize(join(dir, path, '..', specifier));

function pkg(name, dir, dependencies, files, devDependencies = {}) {
  return {
    name,
    dir,
    manifest: { name, dependencies, devDependencies },
    files: Object.entries(files).map(([path, source]) => ({ path, source })),
  };
}

const contracts = pkg(
  '@ledgence/contracts',
  'packages/contracts',
  { valibot: '^1' },
  {
    'src/index.ts': "import * as v from 'valibot';\nimport { x } from './x.js';",
  },
);

describe('findViolations', () => {
  it('accepts a workspace that follows DESIGN §2', () => {
    const worker = pkg(
      '@ledgence/worker',
      'packages/worker',
      { '@ledgence/contracts': 'w' },
      {
        'src/index.ts': "import { ContractError } from '@ledgence/contracts';\nimport 'node:fs';",
      },
    );
    expect(findViolations([contracts, worker], resolve)).toEqual([]);
  });

  it('flags a worker that imports the core, even when its manifest declares it', () => {
    const worker = pkg(
      '@ledgence/worker',
      'packages/worker',
      { '@ledgence/contracts': 'w', '@ledgence/core': 'w' },
      { 'src/index.ts': "export { TaskService } from '@ledgence/core';" },
    );
    const core = pkg('@ledgence/core', 'packages/core', { '@ledgence/contracts': 'w' }, {});
    const violations = findViolations([contracts, core, worker], resolve);
    expect(violations).toContain(
      '@ledgence/worker: package.json depends on @ledgence/core, which DESIGN §2 forbids',
    );
    expect(violations).toContain(
      'packages/worker/src/index.ts: imports @ledgence/core, which DESIGN §2 forbids for @ledgence/worker',
    );
  });

  it('flags server-side third-party packages in the worker', () => {
    const worker = pkg(
      '@ledgence/worker',
      'packages/worker',
      { hono: '4' },
      {
        'src/a.ts': "const pg = await import('postgres');",
      },
    );
    const violations = findViolations([contracts, worker], resolve);
    expect(violations.some((v) => v.includes('depends on hono'))).toBe(true);
    expect(violations.some((v) => v.includes('imports postgres, which @ledgence/worker'))).toBe(
      true,
    );
  });

  it('flags the core importing a store or anything importing the server', () => {
    const core = pkg(
      '@ledgence/core',
      'packages/core',
      {},
      {
        'src/a.ts': "import { x } from '@ledgence/store-postgres';",
      },
    );
    const http = pkg(
      '@ledgence/http',
      'packages/http',
      {},
      {
        'src/a.ts': "import type { S } from '@ledgence/server';",
      },
    );
    const store = pkg('@ledgence/store-postgres', 'packages/store-postgres', {}, {});
    const server = pkg('@ledgence/server', 'apps/server', {}, {});
    const violations = findViolations([contracts, core, http, store, server], resolve);
    expect(violations.some((v) => v.includes('imports @ledgence/store-postgres'))).toBe(true);
    expect(violations.some((v) => v.includes('imports @ledgence/server'))).toBe(true);
  });

  it('flags relative imports that reach into another package', () => {
    const worker = pkg(
      '@ledgence/worker',
      'packages/worker',
      {},
      {
        'src/a.ts': "import { x } from '../../core/src/index.js';",
      },
    );
    expect(findViolations([contracts, worker], resolve)).toEqual([
      'packages/worker/src/a.ts: imports ../../core/src/index.js, outside its own package',
    ]);
  });

  it('flags undeclared packages, allowing devDependencies only in tests', () => {
    const worker = pkg(
      '@ledgence/worker',
      'packages/worker',
      {},
      {
        'src/a.ts': "import fc from 'fast-check';",
        'src/a.test.ts': "import fc from 'fast-check';\nimport { it } from 'vitest';",
      },
      { 'fast-check': '4' },
    );
    expect(findViolations([contracts, worker], resolve, { vitest: '4' })).toEqual([
      'packages/worker/src/a.ts: imports fast-check, which its package.json does not declare',
    ]);
  });

  it('flags a package missing from the table', () => {
    const rogue = pkg('@ledgence/rogue', 'packages/rogue', {}, {});
    expect(findViolations([rogue], resolve)).toEqual([
      '@ledgence/rogue: not in the dependency table of DESIGN §2',
    ]);
  });
});

describe('importSpecifiers', () => {
  it('finds static, type-only, re-export, side-effect, dynamic and require imports', () => {
    const source = [
      "import a from 'a';",
      "import type { B } from '@s/b/deep';",
      "export { c } from './c.js';",
      "export * from 'd';",
      "import 'e';",
      "const f = await import('f');",
      "const g = require('g');",
      'import {\n  h,\n  i,\n} from "h";',
    ].join('\n');
    expect(importSpecifiers(source).sort()).toEqual(
      ['./c.js', '@s/b/deep', 'a', 'd', 'e', 'f', 'g', 'h'].sort(),
    );
    expect(packageOf('@s/b/deep')).toBe('@s/b');
    expect(packageOf('valibot/dist')).toBe('valibot');
  });
});
