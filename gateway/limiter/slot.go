package limiter

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key, or of its hash
// tag (the part between the first "{" and the next "}", when not empty), modulo 16384.
// Decisions whose keys share a slot can share one script call on a cluster.
func slot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return crc16(key) & 16383
				}
			}
			break
		}
	}
	return crc16(key) & 16383
}

// crc16 is CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster
// computes it.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
