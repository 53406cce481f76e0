/**
 * The package README's promises, checked: its example request is correctly
 * signed with its example secret, and its 10-line verifier accepts a real
 * delivery and refuses a tampered one.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { buildCompletionEvent } from '@ledgence/contracts';
import { afterAll, expect, it } from 'vitest';
import { deliverEvent, encodeCompletionEvent } from './deliver.js';
import { parseDestinations } from './destinations.js';
import { signWebhook } from './signature.js';
import { startReceiver } from './testdata/receiver.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const block = (lang: string): string => {
  const match = new RegExp(`\`\`\`${lang}\\n([\\s\\S]*?)\`\`\``).exec(readme);
  if (match?.[1] === undefined) throw new Error(`README has no ${lang} block`);
  return match[1];
};
const dir = mkdtempSync(join(tmpdir(), 'ledgence-callbacks-readme-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it('shows a request correctly signed with the example secret', () => {
  const config = parseDestinations(block('json'));
  const billing = config.get('billing');
  if (billing === undefined) throw new Error('the README configures billing');
  const [head, body] = block('http').split('\n\n');
  const header = (name: string) => new RegExp(`^${name}: (.*)$`, 'm').exec(head ?? '')?.[1] ?? '';
  const sent = (body ?? '').trimEnd();
  const event = encodeCompletionEvent(JSON.parse(sent));
  expect(event.body.toString('utf8')).toBe(sent);
  expect(header('webhook-id')).toBe(event.id);
  expect(
    signWebhook({
      id: event.id,
      timestampSeconds: Number(header('webhook-timestamp')),
      body: sent,
      secret: billing.secret,
    }),
  ).toBe(header('webhook-signature'));
});

it('has a verifier that accepts a real delivery and refuses a tampered one', async () => {
  const file = join(dir, 'verify.mjs');
  writeFileSync(file, block('js'));
  const { verify } = (await import(pathToFileURL(file).href)) as {
    verify: (secret: string, headers: unknown, body: Buffer) => boolean;
  };
  const secret = `whsec_${Buffer.alloc(32, 0x42).toString('base64')}`;
  const receiver = await startReceiver((res) => res.end());
  try {
    const destination = parseDestinations(
      JSON.stringify({ hook: { url: `${receiver.origin}/h`, secret } }),
    ).get('hook');
    if (destination === undefined) throw new Error('configured above');
    const event = encodeCompletionEvent(
      buildCompletionEvent({
        scope: { tenant_id: 'acme', namespace: 'prod' },
        queue: 'email',
        task_id: 'tsk_1',
        run_id: 'run_1',
        state: 'cancelled',
        event_id: 'evt_1',
        time: Date.now(),
      }),
    );
    expect(await deliverEvent({ destination, event })).toMatchObject({ kind: 'delivered' });
    const [got] = receiver.requests;
    if (got === undefined) throw new Error('no request');
    expect(verify(secret, got.headers, got.body)).toBe(true);
    expect(verify(secret, got.headers, Buffer.from(`${got.body} `))).toBe(false);
    expect(verify(`whsec_${Buffer.alloc(32, 1).toString('base64')}`, got.headers, got.body)).toBe(
      false,
    );
    const old = String(Number(got.headers['webhook-timestamp']) - 600);
    expect(verify(secret, { ...got.headers, 'webhook-timestamp': old }, got.body)).toBe(false);
    // A request missing a header, or with a timestamp that is not a number (whose staleness
    // test a NaN would pass), is refused rather than throwing in the receiver's handler.
    for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
      const { [name]: _left, ...headers } = got.headers;
      expect(verify(secret, headers, got.body), name).toBe(false);
    }
    for (const ts of ['', 'soon', `${got.headers['webhook-timestamp']}.5`, ' 1795953605']) {
      expect(verify(secret, { ...got.headers, 'webhook-timestamp': ts }, got.body), ts).toBe(false);
    }
  } finally {
    await receiver.close();
  }
});
