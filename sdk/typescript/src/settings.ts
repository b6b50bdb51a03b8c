// Settings: the TOOLBUS_* variables the Go executors read (connect.Options,
// events.WorkerConfig, events.Config, worker.Settings), read the same way, and the
// connection they describe.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { fromSeed } from '@nats-io/nkeys';
import { connect, credsAuthenticator, nkeyAuthenticator, type ConnectionOptions, type NatsConnection } from '@nats-io/transport-node';

/** Thrown for a setting out of its range; the message names the variable. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Parses a Go duration (300ms, 1.5s, 2m30s, 1h) into milliseconds. */
export function parseDuration(text: string): number {
  const units: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
  const t = text.trim();
  if (t === '0') return 0;
  const neg = t.startsWith('-');
  const body = neg || t.startsWith('+') ? t.slice(1) : t;
  const re = /([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)/gy;
  let ms = 0;
  let at = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(body)) !== null) {
    ms += Number(m[1]) * units[m[2]];
    at = re.lastIndex;
  }
  if (at !== body.length || body.length === 0) throw new ConfigError(`not a duration: ${JSON.stringify(text)} (want e.g. 500ms, 30s, 2m)`);
  return neg ? -ms : ms;
}

/** How to reach the bus: the server URL and every NATS credential kind (TOOLBUS_NATS_*). */
export interface ConnectionSettings {
  /** TOOLBUS_NATS_URL: one URL or several, comma-separated. */
  url: string;
  /** TOOLBUS_NATS_CREDS: a .creds file (JWT + nkey seed). */
  creds?: string;
  /** TOOLBUS_NATS_NKEY: an nkey seed file. */
  nkey?: string;
  /** TOOLBUS_NATS_USER, TOOLBUS_NATS_PASSWORD. */
  user?: string;
  password?: string;
  /** TOOLBUS_NATS_TOKEN. */
  token?: string;
  /** TOOLBUS_NATS_TLS_CA, TOOLBUS_NATS_TLS_CERT, TOOLBUS_NATS_TLS_KEY. */
  tlsCA?: string;
  tlsCert?: string;
  tlsKey?: string;
}

/** What an executor is configured with; every field has the Go executors' default. */
export interface Settings {
  connection: ConnectionSettings;
  /** TOOLBUS_STREAM (TOOLBUS). */
  stream: string;
  /**
   * TOOLBUS_NATS_API_PREFIX: set for an executor in its team's own NATS account (the
   * accounts layout), the prefix under which the account imports the core account's
   * JetStream API (JS.core.API). The executor then binds its queues without creating them,
   * reaches its keys by direct get and publish, reads no run, and takes principal,
   * allowlist, deadline and decisions from the call. Needs TOOLBUS_TEAM.
   */
  apiPrefix: string;
  /**
   * TOOLBUS_NATS_READ_PREFIX: set for a client in a client account of its own (the
   * accounts layout; `toolbus admin add-client NAME ID...`), the prefix of the core's read
   * service for the identity it reads as, `toolbus_read.<id>.API` (wire.readAPIPrefix).
   * The client then reads only through it (direct gets and the stream's info under the
   * prefix, the runs visible to the identity), never the core's JetStream API nor a
   * consumer; it publishes run starts, decisions and cancellations as before. For
   * clients only (an executor refuses it).
   */
  readPrefix: string;
  /** TOOLBUS_INSTANCE (host-pid): names this process in results, sources and its instance record. */
  instance: string;
  /** TOOLBUS_TEAM: the team owning the tools (catalog owner; the token of its instance records). */
  team: string;
  /** TOOLBUS_CONCURRENCY (64): calls run at once. */
  concurrency: number;
  /** TOOLBUS_ACK_WAIT (30s), in ms. */
  ackWaitMS: number;
  /** TOOLBUS_MAX_DELIVER (5): executions of one call before it reports tool_internal_error. */
  maxDeliver: number;
  /** TOOLBUS_GRACE (30s), in ms: how long running calls may finish at shutdown. */
  graceMS: number;
  /** TOOLBUS_INSTANCE_TTL (5s), in ms: the lease. */
  instanceTTLMS: number;
  /** TOOLBUS_CALL_TIMEOUT (30s), in ms: the timeout of tools that set none. */
  callTimeoutMS: number;
  /** TOOLBUS_MAX_OUTPUT_BYTES (16384): the bound of what the model reads of tools that set none. */
  maxOutputBytes: number;
  /** TOOLBUS_EXECUTOR_TOOLS: serve only these of the registered tools (empty: all). */
  tools: string[];
  /** TOOLBUS_EXECUTOR_REPLACE_CONTRACTS: replace a registered contract that differs without a higher version. */
  replaceContracts: boolean;
  /** TOOLBUS_EXECUTOR_PROGRESS_INTERVAL (1s), in ms. */
  progressIntervalMS: number;
  /** TOOLBUS_METRICS_ADDR: host:port of /metrics, /healthz, /readyz (empty: none). */
  metricsAddr: string;
  /** TOOLBUS_LOG_LEVEL (info), TOOLBUS_LOG_FORMAT (text). */
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  logFormat: 'text' | 'json';
  /** Largest output kept in the event itself (256 KiB); larger ones go to KV toolbus_outputs. */
  inlineOutputMax: number;
  /** Calls handed back (queue bound) at most (1000). */
  maxAckPending: number;
  /**
   * Calls of one run in flight across the whole fleet (32; 0 or negative: no bound), as
   * the Go executor's RunMaxInFlight: a call of a step of more calls takes one of the
   * run's slots (KV toolbus_claims, <tool>.<run>.slot.<i>) or is handed back and taken
   * again shortly after.
   */
  runMaxInFlight: number;
  /**
   * TOOLBUS_EXECUTOR_PARK_AFTER (2m), in ms: a tool queue idle this long stops pulling
   * until a call is published for it (a doorbell: a subscription to
   * toolbus.*.tool.requested.<tool>, which the credentials must be allowed); negative: never.
   */
  parkAfterMS: number;
  /** How often a parked queue asks the server whether work waits for it anyway (30m). */
  parkCheckMS: number;
}

type Env = Record<string, string | undefined>;

function num(env: Env, name: string, def: number, min: number): number {
  const v = env[name];
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new ConfigError(`${name}=${v}: want an integer of at least ${min}`);
  return n;
}

function dur(env: Env, name: string, def: number, min: number): number {
  const v = env[name];
  if (v === undefined || v === '') return def;
  let ms: number;
  try {
    ms = parseDuration(v);
  } catch (err) {
    throw new ConfigError(`${name}=${v}: ${(err as Error).message}`);
  }
  if (ms < min) throw new ConfigError(`${name}=${v}: want at least ${min}ms`);
  return ms;
}

function bool(env: Env, name: string): boolean {
  const v = (env[name] ?? '').toLowerCase();
  if (v === '' || v === 'false' || v === '0') return false;
  if (v === 'true' || v === '1') return true;
  throw new ConfigError(`${name}=${env[name]}: want true or false`);
}

/** Reads the settings from the environment (process.env by default), validating each. */
export function settingsFromEnv(env: Env = process.env): Settings {
  const team = env.TOOLBUS_TEAM ?? '';
  if (team && !/^[a-z0-9][a-z0-9_-]{0,31}$/.test(team)) {
    throw new ConfigError(`TOOLBUS_TEAM=${team}: want 1 to 32 of [a-z0-9_-], starting with a letter or digit`);
  }
  const logLevel = (env.TOOLBUS_LOG_LEVEL || 'info').toLowerCase();
  if (!['debug', 'info', 'warn', 'error'].includes(logLevel)) throw new ConfigError(`TOOLBUS_LOG_LEVEL=${logLevel}: want debug, info, warn or error`);
  const logFormat = (env.TOOLBUS_LOG_FORMAT || 'text').toLowerCase();
  if (logFormat !== 'text' && logFormat !== 'json') throw new ConfigError(`TOOLBUS_LOG_FORMAT=${logFormat}: want text or json`);
  const ackWait = dur(env, 'TOOLBUS_ACK_WAIT', 30000, 0);
  if (ackWait !== 0 && ackWait < 1000) throw new ConfigError(`TOOLBUS_ACK_WAIT=${env.TOOLBUS_ACK_WAIT}: want 1s or more`);
  const maxOut = num(env, 'TOOLBUS_MAX_OUTPUT_BYTES', 16384, 0);
  const apiPrefix = (env.TOOLBUS_NATS_API_PREFIX ?? '').trim().replace(/\.$/, '');
  if (apiPrefix && !/^[^.*>\s]+(\.[^.*>\s]+)*$/.test(apiPrefix)) {
    throw new ConfigError(`TOOLBUS_NATS_API_PREFIX=${env.TOOLBUS_NATS_API_PREFIX}: want a subject prefix without wildcards (e.g. JS.core.API)`);
  }
  const readPrefix = (env.TOOLBUS_NATS_READ_PREFIX ?? '').trim().replace(/\.$/, '');
  if (readPrefix && !/^[^.*>\s]+(\.[^.*>\s]+)*$/.test(readPrefix)) {
    throw new ConfigError(`TOOLBUS_NATS_READ_PREFIX=${env.TOOLBUS_NATS_READ_PREFIX}: want a subject prefix without wildcards (e.g. toolbus_read.alice.API)`);
  }
  if (readPrefix && apiPrefix) {
    throw new ConfigError(`TOOLBUS_NATS_READ_PREFIX=${readPrefix} and TOOLBUS_NATS_API_PREFIX=${apiPrefix}: a process is in a client account (read prefix) or a team account (API prefix), not both`);
  }
  if (apiPrefix && !team) {
    throw new ConfigError(`TOOLBUS_NATS_API_PREFIX=${apiPrefix} needs TOOLBUS_TEAM: a team account reaches only the instance records under its team's name`);
  }
  return {
    connection: {
      url: env.TOOLBUS_NATS_URL ?? '',
      creds: env.TOOLBUS_NATS_CREDS || undefined,
      nkey: env.TOOLBUS_NATS_NKEY || undefined,
      user: env.TOOLBUS_NATS_USER || undefined,
      password: env.TOOLBUS_NATS_PASSWORD || undefined,
      token: env.TOOLBUS_NATS_TOKEN || undefined,
      tlsCA: env.TOOLBUS_NATS_TLS_CA || undefined,
      tlsCert: env.TOOLBUS_NATS_TLS_CERT || undefined,
      tlsKey: env.TOOLBUS_NATS_TLS_KEY || undefined,
    },
    stream: env.TOOLBUS_STREAM || 'TOOLBUS',
    apiPrefix,
    readPrefix,
    instance: env.TOOLBUS_INSTANCE || `${os.hostname()}-${process.pid}`,
    team,
    concurrency: num(env, 'TOOLBUS_CONCURRENCY', 64, 0) || 64,
    ackWaitMS: ackWait || 30000,
    maxDeliver: num(env, 'TOOLBUS_MAX_DELIVER', 5, 0) || 5,
    graceMS: dur(env, 'TOOLBUS_GRACE', 30000, 0) || 30000,
    instanceTTLMS: dur(env, 'TOOLBUS_INSTANCE_TTL', 5000, 0) || 5000,
    callTimeoutMS: dur(env, 'TOOLBUS_CALL_TIMEOUT', 30000, 0) || 30000,
    maxOutputBytes: maxOut || 16384,
    tools: (env.TOOLBUS_EXECUTOR_TOOLS ?? '').split(',').map((s) => s.trim()).filter(Boolean),
    replaceContracts: bool(env, 'TOOLBUS_EXECUTOR_REPLACE_CONTRACTS'),
    progressIntervalMS: dur(env, 'TOOLBUS_EXECUTOR_PROGRESS_INTERVAL', 1000, 1) ,
    metricsAddr: env.TOOLBUS_METRICS_ADDR ?? '',
    logLevel: logLevel as Settings['logLevel'],
    logFormat: logFormat as Settings['logFormat'],
    inlineOutputMax: 256 << 10,
    maxAckPending: 1000,
    runMaxInFlight: 32,
    parkAfterMS: dur(env, 'TOOLBUS_EXECUTOR_PARK_AFTER', 120000, -Infinity) || 120000,
    parkCheckMS: 30 * 60000,
  };
}

/**
 * The nats.js options of the connection settings: every credential kind, TLS, and
 * reconnection forever. A credential file that cannot be read is an error, never ignored.
 */
export function connectionOptions(c: ConnectionSettings, name: string): ConnectionOptions {
  if (!c.url) throw new ConfigError('TOOLBUS_NATS_URL is not set');
  const opts: ConnectionOptions = {
    servers: c.url.split(',').map((s) => s.trim()).filter(Boolean),
    name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
  };
  const read = (what: string, file: string) => {
    try {
      return readFileSync(file);
    } catch (err) {
      throw new ConfigError(`${what} ${file}: ${(err as Error).message}`);
    }
  };
  // Read again at every connection, as nats.go does: a credential rotated (toolbus admin
  // rotate rewrites the file and revokes the old one) is taken on the reconnection the
  // revocation causes. A file that cannot be read then keeps the last one read.
  const reread = (what: string, file: string) => {
    let last = read(what, file);
    return () => {
      try {
        last = readFileSync(file);
      } catch {
        // the last one read: the server says whether it still holds
      }
      return last;
    };
  };
  if (c.creds) opts.authenticator = credsAuthenticator(reread('TOOLBUS_NATS_CREDS', c.creds));
  else if (c.nkey) {
    const seed = reread('TOOLBUS_NATS_NKEY', c.nkey);
    opts.authenticator = nkeyAuthenticator(() => new TextEncoder().encode(seed().toString().trim()));
  }
  if (c.user) {
    opts.user = c.user;
    opts.pass = c.password;
  }
  if (c.token) opts.token = c.token;
  if (c.tlsCA || c.tlsCert) {
    opts.tls = {};
    if (c.tlsCA) opts.tls.caFile = c.tlsCA;
    if (c.tlsCert) {
      opts.tls.certFile = c.tlsCert;
      opts.tls.keyFile = c.tlsKey;
    }
  }
  return opts;
}

/** Connects with the connection settings (TOOLBUS_NATS_*). */
export function dial(c: ConnectionSettings, name: string): Promise<NatsConnection> {
  return connect(connectionOptions(c, name));
}

/**
 * The values no tool may leak (connect.Options.Secrets and worker.Secrets): the NATS
 * password and token, the nkey seed, the JWT and seed of a .creds file, and the model
 * providers' API keys of the environment.
 */
export function secretsOf(c: ConnectionSettings, env: Env = process.env): string[] {
  const out = [c.password ?? '', c.token ?? ''];
  for (const f of [c.nkey, c.creds]) {
    if (!f) continue;
    let text: string;
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (let line of text.split('\n')) {
      line = line.trim();
      if (line && !line.startsWith('---') && !line.includes(' ')) out.push(line);
    }
  }
  out.push(env.OPENAI_API_KEY ?? '', env.ANTHROPIC_API_KEY ?? '');
  return out.filter(Boolean);
}

/**
 * The key of a team account's message ids (wire.BusOptions.msgKey), derived from the
 * secret of the credentials as the Go executor derives it (events.teamMsgKey): the
 * ed25519 signature of a fixed text by the user's nkey (.creds or nkey seed), else
 * user and password, else the token. Undefined without any (mutual TLS alone).
 */
export function msgKeyOf(c: ConnectionSettings): Buffer | undefined {
  let material: Uint8Array | undefined;
  const seedOf = (file: string): string | undefined => {
    const text = readFileSync(file, 'utf8');
    return text.split('\n').map((l) => l.trim()).find((l) => /^SU[A-Z2-7]+$/.test(l));
  };
  const seed = c.creds ? seedOf(c.creds) : c.nkey ? readFileSync(c.nkey, 'utf8').trim() : undefined;
  if (seed) material = fromSeed(new TextEncoder().encode(seed)).sign(new TextEncoder().encode('toolbus message ids v1'));
  else if (c.password) material = new TextEncoder().encode(`${c.user ?? ''}\u0000${c.password}`);
  else if (c.token) material = new TextEncoder().encode(c.token);
  if (!material) return undefined;
  return createHash('sha256').update('toolbus-msgid-v1\u0000').update(material).digest();
}
