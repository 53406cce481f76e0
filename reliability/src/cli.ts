/**
 * `pnpm chaos [suite] [--flags]`: runs one reliability suite at any size, prints its figures,
 * the seed and the exact command that replays it, and exits non-zero on any violation.
 *
 *   pnpm chaos --tasks 20000 --seconds 600            # T1 chaos, long run, default seed
 *   pnpm chaos chaos --seed 123 --tasks 2000 --seconds 90
 *
 * A suite is selected by name (default `chaos`); each suite parses its own flags, so adding one
 * is one entry in {@link SUITES}.
 */
import { parseArgs } from 'node:util';
import { DEFAULT_OPTIONS, runChaos } from './chaos/scenario.js';

/** A suite: runs with the arguments after its name; resolves with the process exit code. */
type Suite = (args: string[]) => Promise<number>;

function integer(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 0)
    throw new Error(`--${name} must be a whole number, got ${value}`);
  return n;
}

const chaos: Suite = async (args) => {
  const { values } = parseArgs({
    args,
    options: {
      seed: { type: 'string' },
      tasks: { type: 'string' },
      seconds: { type: 'string' },
      replicas: { type: 'string' },
      workers: { type: 'string' },
      drain: { type: 'string' },
      'keep-logs': { type: 'boolean' },
    },
  });
  const options = {
    seed: integer('seed', values.seed, DEFAULT_OPTIONS.seed),
    tasks: integer('tasks', values.tasks, DEFAULT_OPTIONS.tasks),
    seconds: integer('seconds', values.seconds, DEFAULT_OPTIONS.seconds),
    replicas: integer('replicas', values.replicas, DEFAULT_OPTIONS.replicas),
    workers: integer('workers', values.workers, DEFAULT_OPTIONS.workers),
    drainSeconds: integer('drain', values.drain, DEFAULT_OPTIONS.drainSeconds),
    keepLogs: values['keep-logs'] ?? false,
  };
  const replay =
    `pnpm chaos chaos --seed ${options.seed} --tasks ${options.tasks} --seconds ${options.seconds}` +
    ` --replicas ${options.replicas} --workers ${options.workers}`;
  console.log(`seed ${options.seed}; replay with: ${replay}`);
  const report = await runChaos(options);
  console.log(report.table);
  console.log(`seed ${options.seed}; replay with: ${replay}`);
  if (report.figures.violations > 0) {
    console.log(`${report.figures.violations} violations; logs kept in ${report.runDir}`);
    return 1;
  }
  return 0;
};

/** The suites, by name. */
const SUITES: Record<string, Suite> = { chaos };

async function main(argv: string[]): Promise<number> {
  const named = argv[0] !== undefined && !argv[0].startsWith('-');
  const name = named ? (argv[0] as string) : 'chaos';
  const suite = SUITES[name];
  if (suite === undefined) {
    console.error(`unknown suite ${name}; one of: ${Object.keys(SUITES).join(', ')}`);
    return 2;
  }
  return suite(named ? argv.slice(1) : argv);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  },
);
