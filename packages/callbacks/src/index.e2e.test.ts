/** The module example of src/index.ts, as written there, against a real local receiver. */
import { createServer } from 'node:http';
import { buildCompletionEvent } from '@ledgence/contracts';
import { expect, it } from 'vitest';
import {
  deliverEvent,
  encodeCompletionEvent,
  nextDeliveryState,
  parseDestinations,
} from './index.js';

it('runs the module example', async () => {
  const receiver = createServer((req, res) => req.resume().on('end', () => res.end()));
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as { port: number };

  const destinations = parseDestinations(
    JSON.stringify({
      billing: {
        url: `http://127.0.0.1:${port}/hooks`,
        secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
        timeout_ms: 2000,
      },
    }),
  );
  const event = encodeCompletionEvent(
    buildCompletionEvent({
      scope: { tenant_id: 'acme', namespace: 'prod' },
      queue: 'email',
      task_id: 'tsk_1',
      run_id: 'run_1',
      state: 'succeeded',
      event_id: 'evt_1',
      time: Date.now(),
    }),
  );

  const billing = destinations.get('billing');
  if (billing === undefined) throw new Error('billing is configured above');
  const outcome = await deliverEvent({ destination: billing, event });
  expect(outcome).toEqual({ kind: 'delivered', status: 200 });
  expect(nextDeliveryState({ outcome, attempt: 1, eventId: event.id })).toEqual({
    state: 'delivered',
  });
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
});
