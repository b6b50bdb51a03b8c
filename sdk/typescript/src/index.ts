// @toolbus/sdk: serve tools on the toolbus bus from TypeScript, and start runs and call
// tools from services. The wire (subjects, ids, CloudEvents, stores) is in ./wire.js.
export { Executor, ToolError, WRITE_RETRY_MS, register, serve } from './executor.js';
export type { Authorizer, ExecutorOptions, Retry, Tool, ToolContext } from './executor.js';
export { ConfigError, connectionOptions, dial, parseDuration, secretsOf, settingsFromEnv } from './settings.js';
export type { ConnectionSettings, Settings } from './settings.js';
export { Redactor, REDACTED, truncateText } from './result.js';
export type { Violation } from './result.js';
export { Metrics } from './ops.js';
export * as wire from './wire.js';
export type { Approval, Cancel, Principal, RunEnded, RunStarted, ToolCall, ToolContract, ToolFinished, ToolProgress, ToolResult } from './wire.js';
export { Client, RunExistsError } from './client.js';
export { NotBoundError, TenantQuotaError, TenantStoreFullError, WriteRefusedError, readAPIPrefix } from './wire.js';
export type { ClientOptions, Decision, RunEvent, StartRun } from './client.js';
export { AuditFailure, Signer, verifyBundle } from './audit.js';
export type { Bundle } from './audit.js';
