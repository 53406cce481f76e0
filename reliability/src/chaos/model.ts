/** The records the chaos run's processes append to their JSONL logs, and the shapes they share. */
import type { RetryPolicy } from '@ledgence/contracts';

/**
 * The retry policy every task of the run is submitted with: short, so retries and exhaustion
 * happen within the run. The checker judges dispatches against it, not against the policy the
 * database read back.
 */
export const TASK_RETRY: RetryPolicy = { max_attempts: 3, delay_ms: 50 };

/** A tenant × namespace the run submits to, with the API key of its tenant. */
export interface WorkerScope {
  tenant: string;
  namespace: string;
  apiKey: string;
}

/** A task's `data`: how its handler behaves. */
export interface JobData {
  /** The task's index in the run's plan. */
  i: number;
  /** How long the handler works. */
  ms: number;
  /** `once`: the first attempt throws; `always`: every attempt throws (retryably). */
  fail?: 'once' | 'always';
}

/** One line of a worker's log: an execution of user code started or ended. */
export interface ExecutionRecord {
  event: 'start' | 'end';
  worker: string;
  pid: number;
  task_id: string;
  attempt_id: string;
  attempt: number;
  /** Worker clock, ms: for ordering within one log only. */
  at: number;
  outcome?: 'ok' | 'error';
}

/** One line of the submitter's log. */
export type SubmitRecord =
  | {
      event: 'ack';
      key: string;
      tenant: string;
      namespace: string;
      task_id: string;
      /** Whether this submit repeated a key already sent. */
      repeat: boolean;
      at: number;
    }
  | { event: 'submit_failed'; key: string; error: string; at: number }
  | {
      event: 'subscribed';
      key: string;
      task_id: string;
      subscription_id: string;
      event_id: string;
      at: number;
    }
  | { event: 'subscribe_failed'; key: string; task_id: string; error: string; at: number };

/** The fault kinds, in the words. */
export const FAULT_TYPES = [
  'kill_worker',
  'kill_server',
  'stop_worker',
  'terminate_backends',
  'restart_postgres',
] as const;
/** One kind of fault. */
export type FaultType = (typeof FAULT_TYPES)[number];

/** One line of the fault log. */
export interface FaultRecord {
  type: FaultType;
  /** Which worker or replica (index), if the fault has a target. */
  target?: number;
  /** When the fault started (ms since the epoch) and how long injecting it took. */
  at: number;
  took_ms: number;
  detail?: string;
}

/** One line of the receiver's log: a POST of a completion event. */
export interface DeliveryRecord {
  webhook_id: string;
  task_id: string;
  state: string;
  at: number;
}

/** A process that exited although the run did not kill it. */
export interface UnexpectedExit {
  process: string;
  code: number | string;
  stderr: string;
}
