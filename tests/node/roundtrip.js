'use strict';
// A round trip with node's amqplib (promise API), unchanged, against the broker at
// 127.0.0.1:PORT (or $AMQP_HOST): usage `node roundtrip.js PORT [UID]`.
// Prints one line per step; exits 0 only if every assertion held (tests/integration/
// test_more_clients.py runs it and checks the output).

const assert = require('node:assert/strict');
const amqp = require('amqplib');

const port = process.argv[2];
const uid = process.argv[3] || `${process.pid}-${Date.now()}`;
const host = process.env.AMQP_HOST || '127.0.0.1';
if (!port) {
  console.error('usage: node roundtrip.js PORT [UID]');
  process.exit(2);
}

const HEADERS = { s: 'text', flag: true, nested: { k: 'v' } };

function within(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main() {
  const exchange = `node-x-${uid}`;
  const queue = `node-q-${uid}`;
  const missing = `node-missing-${uid}`;

  const conn = await amqp.connect(`amqp://guest:guest@${host}:${port}`);
  const connErrors = [];
  conn.on('error', (e) => connErrors.push(e));
  try {
    const capabilities = conn.connection.serverProperties.capabilities;
    assert.equal(capabilities.publisher_confirms, true);
    assert.equal(capabilities['basic.nack'], true);
    console.log('connected');

    const ch = await conn.createConfirmChannel();
    assert.deepEqual(await ch.assertExchange(exchange, 'direct', { durable: false, autoDelete: true }), {
      exchange,
    });
    assert.deepEqual(await ch.assertQueue(queue, { exclusive: true }), {
      queue,
      messageCount: 0,
      consumerCount: 0,
    });
    assert.deepEqual(await ch.bindQueue(queue, exchange, 'jobs'), {});
    console.log('declared');

    // Publisher confirms: each publish's callback gets the broker's ack (err === null).
    const events = [];
    for (let i = 0; i < 3; i++) {
      const ok = ch.publish(
        exchange,
        'jobs',
        Buffer.from(`m${i}`),
        {
          headers: { ...HEADERS, n: i },
          deliveryMode: 2,
          contentType: 'text/plain',
          messageId: `id-${i}`,
          correlationId: `c-${i}`,
          priority: 4,
        },
        (err) => events.push(err === null ? `ack ${i}` : `nack ${i}`),
      );
      assert.equal(typeof ok, 'boolean');
    }
    await within(ch.waitForConfirms(), 5000, 'confirms');
    assert.deepEqual(events, ['ack 0', 'ack 1', 'ack 2']);
    console.log(`confirmed ${events.length}`);

    // An unroutable mandatory publish: basic.return arrives before its ack.
    events.length = 0;
    let returned = null;
    ch.once('return', (msg) => {
      returned = msg;
      events.push('return');
    });
    ch.publish(exchange, 'nowhere', Buffer.from('lost'), { mandatory: true }, (err) =>
      events.push(err === null ? 'ack' : 'nack'),
    );
    await within(ch.waitForConfirms(), 5000, 'the confirm of the returned message');
    assert.deepEqual(events, ['return', 'ack']);
    assert.equal(returned.content.toString(), 'lost');
    const r = returned.fields;
    console.log(`returned ${r.replyCode} ${r.replyText} ${r.exchange} ${r.routingKey}`);

    // basic.get with a manual ack; the publisher's properties come back.
    const m0 = await ch.get(queue, { noAck: false });
    assert.equal(m0.content.toString(), 'm0');
    assert.equal(m0.fields.messageCount, 2);
    assert.equal(m0.fields.exchange, exchange);
    assert.equal(m0.fields.routingKey, 'jobs');
    assert.deepEqual(m0.properties.headers, { ...HEADERS, n: 0 });
    assert.equal(m0.properties.deliveryMode, 2);
    assert.equal(m0.properties.contentType, 'text/plain');
    assert.equal(m0.properties.messageId, 'id-0');
    assert.equal(m0.properties.correlationId, 'c-0');
    assert.equal(m0.properties.priority, 4);
    console.log(`get ${m0.content} redelivered=${m0.fields.redelivered}`);
    ch.nack(m0, false, true); // requeued at the head, marked redelivered
    const again = await ch.get(queue, { noAck: false });
    assert.equal(again.fields.messageCount, 2);
    console.log(`get ${again.content} redelivered=${again.fields.redelivered}`);
    ch.ack(again);

    // Consume with manual acks and a prefetch of 1.
    await ch.prefetch(1);
    const consumed = [];
    let gotTwo;
    const twoConsumed = new Promise((resolve) => {
      gotTwo = resolve;
    });
    const { consumerTag } = await ch.consume(
      queue,
      (msg) => {
        consumed.push(msg);
        ch.ack(msg);
        if (consumed.length === 2) gotTwo();
      },
      { noAck: false, consumerTag: `node-${uid}` },
    );
    assert.equal(consumerTag, `node-${uid}`);
    await within(twoConsumed, 5000, 'two deliveries');
    assert.deepEqual(await ch.cancel(consumerTag), { consumerTag });
    for (const msg of consumed) {
      assert.equal(msg.fields.consumerTag, consumerTag);
      assert.equal(msg.fields.redelivered, false);
    }
    assert.deepEqual(
      consumed.map((m) => m.properties.headers.n),
      [1, 2],
    );
    console.log(`consumed ${consumed.map((m) => m.content.toString()).join(',')}`);
    assert.equal(await ch.get(queue), false);
    console.log('get empty');
    await ch.close();

    // The acks took: nothing came back when the channel closed.
    const ch2 = await conn.createChannel();
    assert.deepEqual(await ch2.checkQueue(queue), { queue, messageCount: 0, consumerCount: 0 });

    // A passive declare of a missing queue: the promise rejects with RabbitMQ's code and
    // text, and the channel emits the same as an 'error' event.
    const channelErrors = [];
    ch2.on('error', (e) => channelErrors.push(e));
    let failure = null;
    try {
      await ch2.checkQueue(missing);
    } catch (e) {
      failure = e;
    }
    assert.ok(failure, 'checkQueue of a missing queue did not fail');
    const text = `404 (NOT-FOUND) with message "NOT_FOUND - no queue '${missing}' in vhost '/'"`;
    assert.equal(failure.message, `Operation failed: QueueDeclare; ${text}`);
    assert.equal(failure.code, 404);
    assert.deepEqual([failure.classId, failure.methodId], [50, 10]);
    assert.equal(channelErrors.length, 1);
    assert.equal(channelErrors[0].message, `Channel closed by server: ${text}`);
    console.log(`error ${failure.code} ${channelErrors[0].message}`);

    // The connection is still fine: clean up on a new channel.
    const ch3 = await conn.createChannel();
    assert.deepEqual(await ch3.deleteQueue(queue), { messageCount: 0 });
    assert.deepEqual(await ch3.deleteExchange(exchange), {});
    await ch3.close();
  } finally {
    await conn.close();
  }
  assert.deepEqual(connErrors, []);
  console.log('ok');
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  },
);
