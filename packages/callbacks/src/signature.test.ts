import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import { signWebhook, webhookHeaders } from './signature.js';

// The test vector of the Standard Webhooks reference libraries.
const VECTOR = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  id: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestamp: 1614265330,
  body: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
};
const vectorKey = Buffer.from(VECTOR.secret.slice('whsec_'.length), 'base64');

describe('signWebhook', () => {
  it('matches the Standard Webhooks test vector and the library', () => {
    const options = {
      id: VECTOR.id,
      timestampSeconds: VECTOR.timestamp,
      body: VECTOR.body,
      secret: vectorKey,
    };
    expect(signWebhook(options)).toBe(VECTOR.signature);
    expect(signWebhook({ ...options, body: Buffer.from(VECTOR.body) })).toBe(VECTOR.signature);
    expect(
      new Webhook(VECTOR.secret).sign(VECTOR.id, new Date(VECTOR.timestamp * 1000), VECTOR.body),
    ).toBe(VECTOR.signature);
  });

  it('is HMAC-SHA256 of "id.timestamp.body", base64, v1-prefixed (hand-written check)', () => {
    const key = Buffer.alloc(32, 1);
    const body = Buffer.from('{"id":"evt_1","é":"ü"}', 'utf8');
    const expected = createHmac('sha256', key)
      .update(Buffer.concat([Buffer.from('evt_1.1700000000.'), body]))
      .digest('base64');
    expect(signWebhook({ id: 'evt_1', timestampSeconds: 1_700_000_000, body, secret: key })).toBe(
      `v1,${expected}`,
    );
  });

  it('makes headers the library verifies, and refuses a changed body, id or timestamp', () => {
    const key = Buffer.alloc(24, 9);
    const secret = `whsec_${key.toString('base64')}`;
    const body = '{"specversion":"1.0","id":"evt_1"}';
    const timestampSeconds = Math.floor(Date.now() / 1000);
    const headers = webhookHeaders({ id: 'evt_1', timestampSeconds, body, secret: key });
    expect(headers['webhook-id']).toBe('evt_1');
    expect(headers['webhook-timestamp']).toBe(String(timestampSeconds));
    const hook = new Webhook(secret);
    expect(hook.verify(body, { ...headers })).toEqual({ specversion: '1.0', id: 'evt_1' });
    expect(() => hook.verify(`${body} `, { ...headers })).toThrow('No matching signature');
    expect(() => hook.verify(body, { ...headers, 'webhook-id': 'evt_2' })).toThrow();
    expect(() =>
      hook.verify(body, { ...headers, 'webhook-timestamp': String(timestampSeconds + 1) }),
    ).toThrow();
    expect(() =>
      new Webhook(`whsec_${Buffer.alloc(24, 8).toString('base64')}`).verify(body, { ...headers }),
    ).toThrow();
  });

  it('refuses caller bugs rather than signing them', () => {
    const base = { id: 'evt_1', timestampSeconds: 1, body: '', secret: Buffer.alloc(24) };
    for (const id of ['', 'evt 1', 'evt\n1', 'évt']) {
      expect(() => signWebhook({ ...base, id })).toThrow(TypeError);
    }
    for (const timestampSeconds of [-1, 1.5, Number.NaN]) {
      expect(() => signWebhook({ ...base, timestampSeconds })).toThrow(TypeError);
    }
    expect(() => signWebhook({ ...base, secret: Buffer.alloc(0) })).toThrow(TypeError);
  });
});
