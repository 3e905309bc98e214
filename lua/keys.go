package lua

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// DefaultPrefix is the key prefix of Keys with an empty Prefix.
const DefaultPrefix = "rl"

// Keys builds bucket keys. It is the one place that decides how a bucket is named, so a
// Prefix change (for example per test, or per deployment sharing a Redis) moves every key.
//
// Tenant and route ids are used verbatim: callers pass ids already validated as
// [A-Za-z0-9._-]{1,64} (regions.ValidateID), which contain neither ':' nor '{' nor '}',
// so no escaping is needed and two different (tenant, route) pairs never share a key.
type Keys struct {
	// Prefix starts every key; empty means DefaultPrefix ("rl").
	Prefix string
}

func (k Keys) prefix() string {
	if k.Prefix == "" {
		return DefaultPrefix
	}
	return k.Prefix
}

// Bucket is a tenant's bucket for one route: "rl:{tenant}:route". The hash tag {tenant}
// keeps all of one tenant's buckets in one Redis Cluster slot, so the buckets of one
// decision (a route bucket and a client value's bucket nested in it) fit one script call.
func (k Keys) Bucket(tenant, route string) string {
	return k.prefix() + ":{" + tenant + "}:" + route
}

// Shard is sub-bucket i of a sharded rule. Shard 0 is the unsharded bucket itself (same
// key), so a change of the shard count, or back to none, carries shard 0's tokens over.
// Shards i >= 1 are "rl:tenant:route:i", without a hash tag on purpose, so the shards of
// one hot key spread over a Redis Cluster.
func (k Keys) Shard(tenant, route string, i int) string {
	if i == 0 {
		return k.Bucket(tenant, route)
	}
	return k.prefix() + ":" + tenant + ":" + route + ":" + strconv.Itoa(i)
}

// ValueHashLen is the bytes of SHA-256 kept in a value's key: 128 bits, so two values
// share a bucket only by a collision no one can aim for.
const ValueHashLen = 16

// Value is the bucket of one client value (an IP, a header value, an RLS descriptor
// value) of a tenant's route: "rl:{tenant}:route:v:<base64url of SHA-256(value)
// truncated to 16 bytes>", 22 characters whatever the value, in the tenant's slot.
func (k Keys) Value(tenant, route, value string) string {
	sum := sha256.Sum256([]byte(value))
	return k.prefix() + ":{" + tenant + "}:" + route + ":v:" + base64.RawURLEncoding.EncodeToString(sum[:ValueHashLen])
}

// Band is the bucket of a rule's further band (regions.Band): "rl:{tenant}:route:b:name",
// in the tenant's slot, so a decision's buckets fit one script call. Band names are ids
// like tenants and routes, so no two (route, band) pairs share a key, nor a band a value's.
func (k Keys) Band(tenant, route, band string) string {
	return k.prefix() + ":{" + tenant + "}:" + route + ":b:" + band
}

// Quota is the counter of a calendar quota band for the period starting at start (Unix
// seconds): "rl:{tenant}:route:q:name:start", in the tenant's slot. One key per period,
// so a period boundary needs no reset: the next period's counter is a new key, and the
// old one expires.
func (k Keys) Quota(tenant, route, band string, start int64) string {
	return k.prefix() + ":{" + tenant + "}:" + route + ":q:" + band + ":" + strconv.FormatInt(start, 10)
}
