from tfctl import main

main()
