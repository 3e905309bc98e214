// Package lua owns the Redis side of the shared token bucket: the scripts (decide.lua and
// inspect.lua, each built from the shared state.lua and embedded with go:embed), the one
// Go encoder of their arguments and reader of their replies (Batch), the one reader of a
// bucket's state (TokenBucket.Inspect, used by ratectl bucket inspect), and the one
// function that names keys (Keys).
//
// A bucket is one Redis string: when it is full again (Redis TIME) and the rule it was
// written under, 28 bytes, expiring a second after it is full. One script call decides a
// batch of decisions, each against one or more buckets that must all admit (a client
// value's bucket nested in its tenant's route bucket): one TIME, a GET per bucket, a SET
// per bucket that changed. Redis TIME inside the script means gateway clocks never
// matter; a rule change is converted on the stored bucket, and a caller-supplied cap
// bounds a bucket after a possible raise, so neither a TTL nor a changed rule creates
// tokens. A settle (OpSettle) takes a cost known only after the response into debt with
// no floor but the depth a key can hold (MaxDebtSeconds). A bucket may instead be a
// calendar-quota counter (Bucket.Counter): a used count, one key per period, that a
// decision must also admit (TokenBucket.Counter reads one). See state.lua and decide.lua
// for the details.
//
// Over the limit is an Outcome, not an error; an error means the script did not run or
// the arguments were invalid (ErrInvalidArgument, never a silent allow).
//
// This package must not import gateway, rebalancer, regions or cmd: it knows buckets,
// not tenants' rules or regions.
package lua
