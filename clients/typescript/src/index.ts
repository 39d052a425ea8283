/**
 * `@agent-sandbox/client`: a client of the agent-sandbox daemon (`sandboxctl serve`) over its
 * unix socket, in TypeScript with no runtime dependencies (Node 18 or later). The protocol is
 * docs/protocol.md, "Service mode"; the documents' types follow its JSON Schemas.
 *
 * @packageDocumentation
 */

export {
  type CallOptions,
  type ConnectOptions,
  MAX_BLOB_PUT_BYTES,
  MAX_LINE_BYTES,
  type ReadLineOptions,
  SandboxClient,
  Session,
} from "./client.js";
export { type ErrorCode, SandboxConnectionError, SandboxError } from "./errors.js";
export type * from "./types.js";
