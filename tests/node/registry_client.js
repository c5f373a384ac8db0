// A real third-party client (@kafkajs/confluent-schema-registry from npm)
// against imstream's registry. Run by tests/registry_third_party.rs with
// REGISTRY_URL and SUBJECT set; exits non-zero with a message on any
// mismatch, printing "ok" on success.
'use strict';
const assert = require('node:assert/strict');
const { SchemaRegistry, SchemaType, COMPATIBILITY } = require('@kafkajs/confluent-schema-registry');

const url = process.env.REGISTRY_URL;
const subject = process.env.SUBJECT;
if (!url || !subject) {
  console.error('REGISTRY_URL and SUBJECT are required');
  process.exit(2);
}

const v1 = {
  type: 'record', name: 'Greeting', namespace: 'thirdparty',
  fields: [{ name: 'text', type: 'string' }],
};
const v2 = { ...v1, fields: [...v1.fields, { name: 'lang', type: 'string', default: 'en' }] };
const broken = { ...v1, fields: [...v1.fields, { name: 'mandatory', type: 'long' }] };

async function main() {
  const registry = new SchemaRegistry({ host: url, retry: { retries: 0 } });
  const opts = { subject, compatibility: COMPATIBILITY.BACKWARD_TRANSITIVE };

  const first = await registry.register({ type: SchemaType.AVRO, schema: JSON.stringify(v1) }, opts);
  assert.ok(Number.isInteger(first.id) && first.id > 0, `register returned id ${first.id}`);

  // Registering the identical schema again gives the same id.
  const again = await registry.register({ type: SchemaType.AVRO, schema: JSON.stringify(v1) }, opts);
  assert.equal(again.id, first.id, 'identical schema must keep its id');

  // The subject-level config the client set on first registration is read back.
  const cfg = await registry.api.Subject.config({ subject });
  assert.equal(cfg.data().compatibilityLevel, 'BACKWARD_TRANSITIVE');

  // Encode / decode through the registry (Confluent wire format).
  const bytes = await registry.encode(first.id, { text: 'hello' });
  assert.equal(bytes[0], 0, 'magic byte');
  assert.equal(bytes.readInt32BE(1), first.id, 'schema id in the header');
  const fresh = new SchemaRegistry({ host: url, retry: { retries: 0 } });
  assert.deepEqual({ ...(await fresh.decode(bytes)) }, { text: 'hello' });

  // Compatibility checks through the API the client exposes.
  const ok = await registry.api.Subject.compatible({ subject, body: { schema: JSON.stringify(v2) } });
  assert.equal(ok.data().is_compatible, true, 'adding a field with a default is compatible');
  const bad = await registry.api.Subject.compatible({ subject, body: { schema: JSON.stringify(broken) } });
  assert.equal(bad.data().is_compatible, false, 'adding a field without a default is not');

  // v2 registers as version 2; latest id and version lookups agree.
  const second = await registry.register({ type: SchemaType.AVRO, schema: JSON.stringify(v2) }, opts);
  assert.notEqual(second.id, first.id);
  assert.equal(await registry.getLatestSchemaId(subject), second.id);
  assert.equal(await registry.getRegistryId(subject, 1), first.id);
  assert.equal(await registry.getRegistryIdBySchema(subject, { type: SchemaType.AVRO, schema: JSON.stringify(v1) }), first.id);

  // An incompatible schema is refused with 409.
  let refused = null;
  try {
    await registry.register({ type: SchemaType.AVRO, schema: JSON.stringify(broken) }, opts);
  } catch (e) {
    refused = e;
  }
  assert.ok(refused, 'incompatible schema must be refused');
  assert.equal(refused.status, 409, `status ${refused.status}: ${refused.message}`);
  assert.match(refused.message, /mandatory/, 'the 409 names the offending field');

  // Old data still decodes after the schema evolved.
  assert.deepEqual({ ...(await new SchemaRegistry({ host: url }).decode(bytes)) }, { text: 'hello' });
  console.log('ok');
}

main().catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
