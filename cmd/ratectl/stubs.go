package main

import "github.com/spf13/cobra"

// TEMPORARY: replaced as the lua and sim packages land.
func newBucketCmd(a *app) *cobra.Command { return groupCmd("bucket", "Inspect a bucket in Redis") }
func newSimCmd(a *app) *cobra.Command    { return &cobra.Command{Use: "sim"} }
