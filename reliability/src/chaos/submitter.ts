/**
 * The client side of a chaos run: a seeded plan of tasks (runtime, failure mode, scope, whether
 * to subscribe) and of submits (a quarter repeat an earlier key, so repeats land before and after
 * server kills), sent with the SDK's `Client` through the balancer at a steady pace. Every
 * acknowledged submit and subscription is appended to the submitter's JSONL log before the next
 * step, so the log holds exactly what clients were promised.
 */
import { Client, silentLogger } from '@ledgence/worker';
import { JsonlLog } from './jsonl.js';
import { type JobData, TASK_RETRY, type WorkerScope } from './model.js';

/** The retry policy of every task (defined in model.ts, where the checker reads it too). */
export { TASK_RETRY };
/** The destination alias every subscription names. */
export const DESTINATION = 'sink';

/** One planned task. */
export interface PlannedTask {
  key: string;
  scope: number;
  data: JobData;
  subscribe: boolean;
}

/** The seeded plan: the tasks, and the order of submits (indexes into `tasks`, repeats included). */
export interface SubmitPlan {
  tasks: PlannedTask[];
  submits: number[];
}

/** Shares of the task mix (the figures). */
export interface TaskMix {
  failOnce: number;
  failAlways: number;
  repeat: number;
  subscribe: number;
  minMs: number;
  maxMs: number;
}

/** The mix: 10 % fail once, 2 % always, 25 % of submits repeat a key, runtimes 5–200 ms. */
export const DEFAULT_MIX: TaskMix = {
  failOnce: 0.1,
  failAlways: 0.02,
  repeat: 0.25,
  subscribe: 0.2,
  minMs: 5,
  maxMs: 200,
};

/** Draws the plan of `count` distinct tasks from `random`. */
export function planSubmits(
  random: () => number,
  count: number,
  scopes: number,
  seed: number,
  mix: TaskMix = DEFAULT_MIX,
): SubmitPlan {
  const tasks: PlannedTask[] = [];
  const submits: number[] = [];
  while (tasks.length < count) {
    if (tasks.length > 0 && random() < mix.repeat) {
      submits.push(Math.floor(random() * tasks.length));
      continue;
    }
    const i = tasks.length;
    const roll = random();
    const fail =
      roll < mix.failAlways ? 'always' : roll < mix.failAlways + mix.failOnce ? 'once' : undefined;
    const ms = mix.minMs + Math.floor(random() * (mix.maxMs - mix.minMs + 1));
    tasks.push({
      // The seed is part of the key, so two runs on one database would never collide.
      key: `chaos-${seed}-${i}`,
      scope: Math.floor(random() * scopes),
      data: fail === undefined ? { i, ms } : { i, ms, fail },
      subscribe: random() < mix.subscribe,
    });
    submits.push(i);
  }
  return { tasks, submits };
}

/** Settings of {@link runSubmitter}. */
export interface SubmitterOptions {
  url: string;
  scopes: WorkerScope[];
  queue: string;
  plan: SubmitPlan;
  /** Submits are spread evenly over this window. */
  windowMs: number;
  /** Submits in flight at once. */
  parallel: number;
  logPath: string;
}

/** What the submitter did, for the figures. */
export interface SubmitterSummary {
  acked: number;
  failed: number;
  /** Keys never acknowledged even by the final pass. */
  unacknowledged: number;
}

/**
 * Sends the plan's submits, then resubmits (same key, same bytes) every task whose submits all
 * failed, so that each planned task is acknowledged at least once when the servers allow it.
 */
export async function runSubmitter(options: SubmitterOptions): Promise<SubmitterSummary> {
  const { plan, scopes } = options;
  const log = new JsonlLog(options.logPath);
  const clients = scopes.map(
    (scope) =>
      new Client({
        url: options.url,
        apiKey: scope.apiKey,
        tenant: scope.tenant,
        namespace: scope.namespace,
        logger: silentLogger,
        // Generous: a submit rides out a replica kill or a database restart by retrying.
        retries: 30,
        backoff: { baseMs: 50, maxMs: 500 },
        requestTimeoutMs: 5_000,
      }),
  );
  const sent = new Set<number>();
  const acked = new Set<number>();
  const subscribed = new Set<number>();
  let ackCount = 0;
  let failed = 0;

  const submitOne = async (index: number): Promise<void> => {
    const task = plan.tasks[index] as PlannedTask;
    const client = clients[task.scope] as Client;
    const repeat = sent.has(index);
    sent.add(index);
    try {
      const snapshot = await client.submit(
        { queue: options.queue, program: 'job', data: task.data, retry: TASK_RETRY },
        { idempotencyKey: task.key },
      );
      const scope = scopes[task.scope] as WorkerScope;
      log.append({
        event: 'ack',
        key: task.key,
        tenant: scope.tenant,
        namespace: scope.namespace,
        task_id: snapshot.task_id,
        repeat,
        at: Date.now(),
      });
      acked.add(index);
      ackCount += 1;
      if (task.subscribe && !subscribed.has(index)) await subscribeOne(index, snapshot.task_id);
    } catch (error) {
      failed += 1;
      log.append({ event: 'submit_failed', key: task.key, error: String(error), at: Date.now() });
    }
  };

  const subscribeOne = async (index: number, taskId: string): Promise<void> => {
    const task = plan.tasks[index] as PlannedTask;
    const client = clients[task.scope] as Client;
    try {
      // The key makes a repeated subscribe (after a lost reply) return the same subscription.
      const subscription = await client.subscribe(taskId, {
        destination: DESTINATION,
        subscriptionKey: `sub-${task.key}`,
      });
      subscribed.add(index);
      log.append({
        event: 'subscribed',
        key: task.key,
        task_id: taskId,
        subscription_id: subscription.id,
        event_id: subscription.event_id,
        at: Date.now(),
      });
    } catch (error) {
      log.append({
        event: 'subscribe_failed',
        key: task.key,
        task_id: taskId,
        error: String(error),
        at: Date.now(),
      });
    }
  };

  const started = Date.now();
  const interval = options.windowMs / Math.max(1, plan.submits.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: options.parallel }, async () => {
      while (next < plan.submits.length) {
        const position = next++;
        const due = started + position * interval;
        if (due > Date.now()) await new Promise((r) => setTimeout(r, due - Date.now()));
        await submitOne(plan.submits[position] as number);
      }
    }),
  );
  // The final pass: tasks never acknowledged get their key again.
  for (let index = 0; index < plan.tasks.length; index++) {
    if (!acked.has(index)) await submitOne(index);
  }
  return { acked: ackCount, failed, unacknowledged: plan.tasks.length - acked.size };
}
