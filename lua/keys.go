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

// Ref names one bucket: its key and its rule record (see prelude.lua), or no record
// ("") for a bucket that starts empty when missing and never expires.
type Ref struct {
	Key    string
	Record string
}

func (k Keys) prefix() string {
	if k.Prefix == "" {
		return DefaultPrefix
	}
	return k.Prefix
}

// Bucket is a tenant's bucket for one route: key "rl:{tenant}:route", record
// "rl:{tenant}:route:rule". The hash tag {tenant} keeps all of one tenant's buckets and
// records in one Redis Cluster slot.
func (k Keys) Bucket(tenant, route string) Ref {
	b := k.prefix() + ":{" + tenant + "}:" + route
	return Ref{Key: b, Record: b + ":rule"}
}

// Shard is sub-bucket i of a sharded rule. Shard 0 is the unsharded bucket itself (same
// key and record), so a change of the shard count, or back to none, carries shard 0's
// tokens over and lets its record see the change. Shards i >= 1 are
// "rl:tenant:route:i", without a hash tag on purpose, so the shards of one hot key
// spread over a Redis Cluster; they cannot reach the record in another slot, so they
// have none: a missing shard starts empty (never a full bucket out of nothing) and
// never expires.
func (k Keys) Shard(tenant, route string, i int) Ref {
	if i == 0 {
		return k.Bucket(tenant, route)
	}
	return Ref{Key: k.prefix() + ":" + tenant + ":" + route + ":" + strconv.Itoa(i)}
}

// ValueHashLen is the bytes of SHA-256 kept in a value's key: 128 bits, so two values
// share a bucket only by a collision no one can aim for.
const ValueHashLen = 16

// Value is the bucket of one client value (an IP, a header value, an RLS descriptor
// value) of a tenant's route: key "rl:{tenant}:route:v:<base64url of SHA-256(value)
// truncated to 16 bytes>", 22 characters whatever the value, record "rl:{tenant}:route:v"
// (one per route, shared by its values).
func (k Keys) Value(tenant, route, value string) Ref {
	sum := sha256.Sum256([]byte(value))
	fam := k.prefix() + ":{" + tenant + "}:" + route + ":v"
	return Ref{Key: fam + ":" + base64.RawURLEncoding.EncodeToString(sum[:ValueHashLen]), Record: fam}
}
