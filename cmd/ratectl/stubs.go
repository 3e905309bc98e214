package main

import "github.com/spf13/cobra"

// TEMPORARY: replaced as the store, lua and sim packages land.
func newMigrateCmd(a *app) *cobra.Command { return groupCmd("migrate", "Apply or show migrations") }
func newRegionsCmd(a *app) *cobra.Command { return groupCmd("regions", "List, add and remove regions") }
func newKeysCmd(a *app) *cobra.Command    { return groupCmd("keys", "Create, list and revoke API keys") }
func newRulesCmd(a *app) *cobra.Command   { return groupCmd("rules", "List, set and delete rules") }
func newSharesCmd(a *app) *cobra.Command  { return groupCmd("shares", "Show and override shares") }
func newBucketCmd(a *app) *cobra.Command  { return groupCmd("bucket", "Inspect a bucket in Redis") }
func newSimCmd(a *app) *cobra.Command     { return &cobra.Command{Use: "sim"} }
