package lua

import (
	"crypto/sha256"
	"encoding/hex"
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

// Bucket is the key of a tenant's bucket for one route: "rl:{tenant}:route". The hash
// tag {tenant} keeps all of one tenant's buckets in one Redis Cluster slot.
func (k Keys) Bucket(tenant, route string) string {
	return k.prefix() + ":{" + tenant + "}:" + route
}

// Shard is the key of sub-bucket i of a sharded rule: "rl:tenant:route:i". It has no
// hash tag on purpose, so the shards of one hot key spread over a Redis Cluster.
func (k Keys) Shard(tenant, route string, i int) string {
	return k.prefix() + ":" + tenant + ":" + route + ":" + strconv.Itoa(i)
}

// ValueRoute is the route part of a per-value bucket: "route:v:<hash>", the hash being
// the first 16 bytes of the SHA-256 of value in hex. Values are client data (an IP, a
// header), so they are hashed: the key holds no ':', '{' or '}' from a client and has a
// fixed length whatever the value.
func ValueRoute(route, value string) string {
	h := sha256.Sum256([]byte(value))
	return route + ":v:" + hex.EncodeToString(h[:16])
}
