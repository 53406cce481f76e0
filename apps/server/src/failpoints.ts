/**
 * The server's side of the test-only failpoints (issue #8, T2): arming them
 * from the configuration, and the `<op>.after_reply` points, which sit below
 * the HTTP app — only the Node response knows when a reply has left.
 */
import type { ServerResponse } from 'node:http';
import {
  createFailpoints,
  type FailpointName,
  type FailpointRouteOperation,
  type FailpointSetting,
  type Failpoints,
} from '@ledgence/core';

/**
 * The failpoints of `settings`; each one that fires first writes one line to
 * stderr (synchronous on a pipe or file), so a test knows which point ended
 * the process. None armed → `NO_FAILPOINTS`.
 */
export function serverFailpoints(settings: readonly FailpointSetting[]): Failpoints {
  return createFailpoints(settings, {
    onFire: (name, action) => process.stderr.write(`failpoint fired: ${name} (${action})\n`),
  });
}

const SCOPED_SUBMIT = /^\/v1\/tenants\/[^/]+\/namespaces\/[^/]+\/tasks(?::batch)?$/;
const SCOPED_CANCEL = /^\/v1\/tenants\/[^/]+\/namespaces\/[^/]+\/tasks\/[^/]+\/cancel$/;
const WORKER_ROUTE = /^\/v1\/worker\/(acquire|renew|settle|quiescence)(?::batch)?$/;

/** The operation whose after-reply point a request passes, or `undefined`. */
export function replyOperation(
  method: string,
  pathname: string,
): FailpointRouteOperation | undefined {
  if (method !== 'POST') return undefined;
  if (SCOPED_SUBMIT.test(pathname)) return 'submit';
  if (SCOPED_CANCEL.test(pathname)) return 'cancel';
  const worker = WORKER_ROUTE.exec(pathname);
  return worker?.[1] as FailpointRouteOperation | undefined;
}

/**
 * Arms `<op>.after_reply` for one answered request: it fires once the reply's
 * last byte was handed to the socket (`finish`), for a 2xx reply of submit,
 * acquire (only one carrying an assignment — empty polls run all the time),
 * renew, settle, quiescence or cancel. Call only with failpoints enabled.
 */
export async function armAfterReply(
  failpoints: Failpoints,
  request: Request,
  response: Response,
  outgoing: ServerResponse | undefined,
): Promise<void> {
  if (outgoing === undefined || response.status < 200 || response.status > 299) return;
  const op = replyOperation(request.method, new URL(request.url).pathname);
  if (op === undefined) return;
  if (op === 'acquire' && !(await response.clone().text()).includes('"assigned"')) return;
  const name: FailpointName = `${op}.after_reply`;
  outgoing.once('finish', () => {
    try {
      failpoints.hit(name);
    } catch {
      // `error` after the reply has nothing left to fail: the answer is out.
    }
  });
}
