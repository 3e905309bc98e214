//go:build race

package limiter

// raceEnabled: the race detector makes the million-key tests ~20x slower; they use
// fewer keys under it (the same assertions, scaled).
const raceEnabled = true
