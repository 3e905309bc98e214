package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

// buildInfo is what `ratectl version` prints.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: "unknown", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of ratectl",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			b := a.build()
			return a.render(cmd, b, func(w io.Writer) {
				mod := ""
				if b.Modified {
					mod = " (modified)"
				}
				fmt.Fprintf(w, "ratectl %s\ncommit %s%s\n%s %s\n", b.Version, b.Commit, mod, b.GoVersion, b.Platform)
			})
		}),
	}
}

func newCompletionCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a shell completion script.

  bash:  source <(ratectl completion bash)
  zsh:   ratectl completion zsh > "${fpath[1]}/_ratectl"
  fish:  ratectl completion fish > ~/.config/fish/completions/ratectl.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s needs one shell: bash, zsh or fish", cmd.CommandPath())
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			case "fish":
				return root.GenFishCompletion(w, true)
			default:
				return usagef("completion for %q: supported shells are bash, zsh and fish", args[0])
			}
		}),
	}
}
